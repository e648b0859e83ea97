"""The learner's model, per backend: what differs between PEFT, PEFT on 4-bit weights and Unsloth lives here.

- `peft`: transformers + PEFT LoRA; base weights in bf16/fp32, or bitsandbytes NF4 (`load_in_4bit`, CUDA only).
- `unsloth`: Unsloth's FastLanguageModel (4-bit or 16-bit base + LoRA, its offloaded gradient checkpointing);
  CUDA only. Unsloth must be the first ML import of the process: see rl/__init__.py.
- full fine-tuning (`model.full_finetune`): every parameter is trained, with either backend's loader.

`plain_lora_forwards` undoes what Unsloth adds around the LoRA layers, for a sweep pack's grouped step
(rl/learner/grouped.py), which must run each LoRA layer's own forward.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from rl.config.choices import LearnerBackend
from rl.config.schema import ModelConfig


@dataclass
class PolicyModel:
    """The trained model and what the step needs to know about it."""

    model: Any
    checkpointing: bool  # gradient checkpointing on (Unsloth's forbids the KV-cache prompt sharing)
    logits_to_keep: bool  # the forward takes `logits_to_keep` (the LM head can skip prompt positions)
    ref_model: Any = None  # full fine-tuning with a KL: a frozen copy of the initial weights
    full_finetune: bool = False
    # a run that starts from an adapter (model.init_adapter) with a KL: that adapter's weights, the reference
    ref_adapter: dict[str, Any] | None = None
    # the adapter layers, found at the first reference forward (`_adapter_off`)
    _adapter_layers: list[torch.nn.Module] | None = field(default=None, init=False, repr=False)

    def reference(self):
        """Context manager yielding the reference policy: the adapter switched off, the frozen copy, or (a run that
        starts from an adapter) the model with the starting adapter's weights swapped in. The swap writes the
        trainable tensors in place: call it before the step's own forward, whose graph would otherwise hold
        tensors the swap changed."""
        if self.ref_model is not None:
            return contextlib.nullcontext(self.ref_model)
        if self.full_finetune:
            raise RuntimeError("this full fine-tuning learner keeps no reference copy (built only when kl_coef > 0)")
        if self.ref_adapter is not None:
            return self._starting_adapter()
        return self._adapter_off()

    @contextlib.contextmanager
    def _adapter_off(self):
        """The model with its adapter switched off: each adapter layer's own switch (`_disable_adapters`, what
        PEFT's and Unsloth's LoRA forwards read), flipped directly. PEFT's `model.disable_adapter()` flips the same
        switches but also walks every layer's parameters to check them and to reset their requires_grad on the
        way out: 75-90 ms a call for SmolLM2's 210 LoRA layers on a 2-core CPU, about 1.5 ms this way, and a step
        enters it once per micro-batch. The reference forward runs under no_grad, so requires_grad stays as it is."""
        if self._adapter_layers is None:
            from peft.tuners.tuners_utils import BaseTunerLayer
            from peft.utils.other import AuxiliaryTrainingWrapper

            kinds = (BaseTunerLayer, AuxiliaryTrainingWrapper)
            self._adapter_layers = [m for m in self.model.modules() if isinstance(m, kinds)]
        layers = self._adapter_layers
        was = [m._disable_adapters for m in layers]
        model_was = getattr(self.model, "_adapters_disabled", False)
        try:
            for m in layers:
                m._disable_adapters = True
            self.model._adapters_disabled = True
            yield self.model
        finally:
            for m, w in zip(layers, was):
                m._disable_adapters = w
            self.model._adapters_disabled = model_was

    @contextlib.contextmanager
    def _starting_adapter(self):
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            current = {n: params[n].detach().clone() for n in self.ref_adapter}
            for n, t in self.ref_adapter.items():
                params[n].copy_(t)
        try:
            yield self.model
        finally:
            with torch.no_grad():
                for n, t in current.items():
                    params[n].copy_(t)


def load_policy(m: ModelConfig, device: torch.device, *, max_seq_length: int, seed: int, kl: bool) -> PolicyModel:
    """Load the base model of the resolved `model` group on `device` with its learner backend, add LoRA (unless full
    fine-tuning), and build the reference copy when a full fine-tune needs one for its KL (`kl`: a KL penalty, in the
    loss or the reward, is on). `max_seq_length` and `seed` are Unsloth's (its context and LoRA init)."""
    unsloth = m.learner_backend == LearnerBackend.unsloth
    if device.type != "cuda" and (unsloth or m.load_in_4bit):
        raise RuntimeError(
            f"{'model.learner_backend=unsloth' if unsloth else 'model.load_in_4bit=true'} needs a "
            "CUDA GPU, and this learner's process sees none (cluster.use_gpu=true, but Ray gave it no GPU?)"
        )
    lora = None
    if not m.full_finetune:  # PEFT's and Unsloth's names for the same four settings
        lora = {
            "r": m.lora_rank,
            "lora_alpha": m.lora_alpha,
            "lora_dropout": m.lora_dropout,
            "target_modules": list(m.lora_targets),
        }
    if unsloth:
        model, checkpointing = _build_unsloth(m, device, lora, max_seq_length=max_seq_length, seed=seed)
    else:
        model, checkpointing = _build_peft(m, device, lora)
    model.train()
    import inspect

    base_forward = model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward
    policy = PolicyModel(
        model,
        checkpointing=checkpointing,
        logits_to_keep="logits_to_keep" in inspect.signature(base_forward).parameters,
        full_finetune=m.full_finetune,
    )
    # a KL (in the loss or folded into the reward) needs the reference; with no adapter to switch off: a frozen copy
    if m.full_finetune and kl:
        import copy

        policy.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    return policy


def _build_peft(m: ModelConfig, device: torch.device, lora: dict | None) -> tuple[Any, bool]:
    """transformers model (bitsandbytes NF4 base with bf16 compute when load_in_4bit) + PEFT LoRA."""
    from transformers import AutoModelForCausalLM

    kwargs: dict = {"dtype": getattr(torch, m.learner_dtype.value), "trust_remote_code": m.trust_remote_code}
    if m.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True,
        )
        kwargs["device_map"] = {"": device}
    model = AutoModelForCausalLM.from_pretrained(m.path, **kwargs)
    if not m.load_in_4bit:
        model = model.to(device)
    model.config.use_cache = False
    checkpointing = bool(m.gradient_checkpointing)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if lora is None:
        return model, checkpointing
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(**lora, task_type="CAUSAL_LM")), checkpointing


def _build_unsloth(
    m: ModelConfig, device: torch.device, lora: dict | None, *, max_seq_length: int, seed: int
) -> tuple[Any, bool]:
    """Unsloth FastLanguageModel (+ its LoRA with gradient checkpointing "unsloth", on by default)."""
    import sys

    if "unsloth" not in sys.modules:
        import warnings

        warnings.warn(
            "unsloth was imported after torch in this process: its patches may be incomplete "
            "(rl/__init__.py imports it first in learner actors)",
            stacklevel=2,
        )
    # Unsloth returns empty logits from a training forward unless asked (it fuses the loss with labels)
    os.environ["UNSLOTH_RETURN_LOGITS"] = "1"
    from unsloth import FastLanguageModel

    model, _ = FastLanguageModel.from_pretrained(
        model_name=m.path,
        max_seq_length=max_seq_length,
        dtype=getattr(torch, m.learner_dtype.value),
        load_in_4bit=m.load_in_4bit,
        full_finetuning=lora is None,
        trust_remote_code=m.trust_remote_code,
    )
    checkpointing = m.gradient_checkpointing is not False
    if lora is None:
        if checkpointing:
            model.gradient_checkpointing_enable()
        return model, checkpointing
    model = FastLanguageModel.get_peft_model(
        model,
        **lora,
        bias="none",
        use_gradient_checkpointing="unsloth" if checkpointing else False,
        random_state=seed,
    )
    return model, checkpointing


def plain_lora_forwards(model: Any) -> str | None:
    """Make every LoRA layer of an Unsloth model run its own (PEFT's) forward, for the rest of the process: the
    fused LoRA kernels Unsloth installs on attention and MLP modules (they read the layer's one active adapter and
    skip its forward) are switched back to PEFT's, and its per-decoder-block torch.compile is turned off per block
    (a compiled block would keep the forwards it traced). Returns None when done, else why not, in one line. A no-op
    on a model without them (the PEFT backend)."""
    import sys

    if "unsloth" not in sys.modules:
        return None
    if os.environ.get("UNSLOTH_FORCE_FUSED_LORA", "0") == "1":
        return "UNSLOTH_FORCE_FUSED_LORA=1 keeps Unsloth's fused LoRA kernels"
    try:
        from unsloth.models._block_compile import _MARK, _OFF
        from unsloth.models.llama import _decline_fused_lora_for_fsdp, _fused_lora_modules
    except ImportError as e:  # another Unsloth release: the learner steps the jobs one after another
        return f"this Unsloth release has no way to switch its fused LoRA kernels off ({e})"
    _decline_fused_lora_for_fsdp(model, "a sweep pack steps its jobs' adapters in one grouped forward")
    left = _fused_lora_modules(model)
    if left:
        return f"Unsloth kept its fused LoRA kernel on {type(left[0]).__name__}"
    for module in model.modules():
        if getattr(type(module).forward, _MARK, False):
            module.__dict__["_unsloth_block_mode"] = _OFF
    return None
