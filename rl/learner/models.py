"""The learner's model, per backend: what differs between PEFT, PEFT on 4-bit weights and Unsloth lives here.

- `peft`: transformers + PEFT LoRA; base weights in bf16/fp32, or bitsandbytes NF4 (`load_in_4bit`, CUDA only).
- `unsloth`: Unsloth's FastLanguageModel (4-bit or 16-bit base + LoRA, its offloaded gradient checkpointing);
  CUDA only. Unsloth must be the first ML import of the process: see rl/__init__.py.
- full fine-tuning (`spec.lora is None`): every parameter is trained, with either backend's loader.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch

from rl.config.resolve import LearnerSpec


@dataclass
class PolicyModel:
    """The trained model and what the step needs to know about it."""

    model: Any
    checkpointing: bool  # gradient checkpointing on (Unsloth's forbids the KV-cache prompt sharing)
    logits_to_keep: bool  # the forward takes `logits_to_keep` (the LM head can skip prompt positions)
    ref_model: Any = None  # full fine-tuning with a KL: a frozen copy of the initial weights
    full_finetune: bool = False

    def reference(self):
        """Context manager yielding the reference policy: the adapter switched off, or the frozen copy."""
        if self.ref_model is not None:
            return contextlib.nullcontext(self.ref_model)
        if self.full_finetune:
            raise RuntimeError("this full fine-tuning learner keeps no reference copy (built only when kl_coef > 0)")

        @contextlib.contextmanager
        def adapter_off():
            with self.model.disable_adapter():
                yield self.model

        return adapter_off()


def load_policy(spec: LearnerSpec, device: torch.device) -> PolicyModel:
    """Load the base model on `device` with the spec's backend, add LoRA (unless full fine-tuning), and build the
    reference copy when a full fine-tune needs one for its KL."""
    if device.type != "cuda" and (spec.backend == "unsloth" or spec.load_in_4bit):
        raise RuntimeError(
            f"{'model.learner_backend=unsloth' if spec.backend == 'unsloth' else 'model.load_in_4bit=true'} needs a "
            "CUDA GPU, and this learner's process sees none (cluster.use_gpu=true, but Ray gave it no GPU?)"
        )
    lora = None
    if spec.lora is not None:  # PEFT's and Unsloth's names for the same four settings
        r = spec.lora
        lora = {"r": r.rank, "lora_alpha": r.alpha, "lora_dropout": r.dropout, "target_modules": list(r.targets)}
    build = _build_unsloth if spec.backend == "unsloth" else _build_peft
    model, checkpointing = build(spec, device, lora)
    model.train()
    import inspect

    base_forward = model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward
    policy = PolicyModel(
        model,
        checkpointing=checkpointing,
        logits_to_keep="logits_to_keep" in inspect.signature(base_forward).parameters,
        full_finetune=spec.full_finetune,
    )
    if spec.full_finetune and spec.keep_reference:  # no adapter to switch off: a frozen copy
        import copy

        policy.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    return policy


def _build_peft(spec: LearnerSpec, device: torch.device, lora: dict | None) -> tuple[Any, bool]:
    """transformers model (bitsandbytes NF4 base with bf16 compute when load_in_4bit) + PEFT LoRA."""
    from transformers import AutoModelForCausalLM

    kwargs: dict = {"dtype": getattr(torch, spec.dtype), "trust_remote_code": spec.trust_remote_code}
    if spec.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True,
        )
        kwargs["device_map"] = {"": device}
    model = AutoModelForCausalLM.from_pretrained(spec.model_path, **kwargs)
    if not spec.load_in_4bit:
        model = model.to(device)
    model.config.use_cache = False
    checkpointing = bool(spec.gradient_checkpointing)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if lora is None:
        return model, checkpointing
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(**lora, task_type="CAUSAL_LM")), checkpointing


def _build_unsloth(spec: LearnerSpec, device: torch.device, lora: dict | None) -> tuple[Any, bool]:
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
        model_name=spec.model_path,
        max_seq_length=spec.max_seq_length,
        dtype=getattr(torch, spec.dtype),
        load_in_4bit=spec.load_in_4bit,
        full_finetuning=lora is None,
        trust_remote_code=spec.trust_remote_code,
    )
    checkpointing = spec.gradient_checkpointing is not False
    if lora is None:
        if checkpointing:
            model.gradient_checkpointing_enable()
        return model, checkpointing
    model = FastLanguageModel.get_peft_model(
        model,
        **lora,
        bias="none",
        use_gradient_checkpointing="unsloth" if checkpointing else False,
        random_state=spec.seed,
    )
    return model, checkpointing
