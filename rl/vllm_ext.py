"""vLLM worker extension: load a LoRA adapter version by merging it into the engine's base weights.

vLLM's native LoRA path (`LoRARequest`) is exact and is the default on GPUs, but its CPU kernels cost about 3x
the base model's decode speed on this machine (measured: 254 vs 22 tok/s on SmolLM2-135M, 128 samples). With
`rollout.lora_mode=merged` the actor instead receives the same adapter bytes and computes
W = W0 + (alpha / r) * B @ A for every targeted projection, then reloads those weights through vLLM's layerwise
reload (which re-runs the CPU kernels' weight packing). Untargeted siblings of a fused layer (q/k/v in
qkv_proj, gate/up in gate_up_proj) are sent with their base values so that every fused layer is complete.

Loaded by vLLM inside its worker process (`LLM(worker_extension_cls="rl.vllm_ext.LoraMergeExtension")`) and
called through `llm.collective_rpc("rlft_merge_adapter", args=(...))`; method names carry an `rlft_` prefix so
they cannot clash with the worker's own. `rlft_load_weights` loads a full fine-tuning learner's weights.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import torch

_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.default)?\.weight$")
# HF projection names grouped the way vLLM fuses them into one parameter (Llama/Qwen/Mistral families)
_FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
_SIBLINGS = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}


def lora_factors(config: dict, weights: dict[str, torch.Tensor]) -> tuple[dict[str, tuple], float]:
    """PEFT LoRA tensors -> ({hf_module_name: (B [out, r], A [r, in])}, PEFT's scaling alpha / r or rsLoRA's)."""
    r, alpha = config["r"], config["lora_alpha"]
    scale = alpha / (r**0.5) if config.get("use_rslora") else alpha / r
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in weights.items():
        m = _PEFT_KEY.match(key)
        if m is None:
            raise ValueError(f"adapter tensor {key!r} is not a PEFT LoRA A/B weight")
        pairs.setdefault(m["module"], {})[m["ab"]] = t
    out = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"adapter module {module!r} has lora_{''.join(ab)} only")
        out[module] = (ab["B"], ab["A"])
    return out, scale


def merge_lora(w0: torch.Tensor, b: torch.Tensor, a: torch.Tensor, scale: float) -> torch.Tensor:
    """W0 + scale * B @ A as one fused addmm in W0's dtype: the factors are rounded to that dtype first (as vLLM's
    own LoRA kernels hold them) and the product accumulates in fp32. On this CPU a bf16 merge takes about half the
    time of an fp32 addmm rounded afterwards, and differs from it by one unit in the last place in about 0.2% of
    the elements (`python -m bench.sync --micro-only`)."""
    return torch.addmm(w0, b.to(w0.dtype), a.to(w0.dtype), alpha=scale)


def lora_deltas(config: dict, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{hf_module_name: scale * B @ A}: the unfused form, kept for bench/sync.py's comparison with merge_lora."""
    factors, scale = lora_factors(config, weights)
    return {m: (b.float() @ a.float()) * scale for m, (b, a) in factors.items()}


def merged_payload(
    base: dict[str, torch.Tensor], factors: dict[str, tuple], scale: float
) -> list[tuple[str, torch.Tensor]]:
    """(HF weight name, merged tensor) for every projection the adapter touches, with the untargeted siblings of a
    fused vLLM layer at their base values; no factors = every base projection (back to the base model)."""
    names: set[str] = set()
    for module in factors:
        prefix, _, proj = module.rpartition(".")
        group = _FUSED.get(proj)
        names.update(f"{prefix}.{s}.weight" for s in (_SIBLINGS[group] if group else (proj,)))
    if not factors:  # back to the base: reload every projection that an earlier adapter may have changed
        names = set(base)
    payload = []
    for name in sorted(names):
        if name not in base:
            raise KeyError(f"adapter targets {name}, which the base checkpoint does not have")
        w0, ba = base[name], factors.get(name.removesuffix(".weight"))
        payload.append((name, w0 if ba is None else merge_lora(w0, *ba, scale)))
    return payload


class LoraMergeExtension:
    """Mixed into vLLM's worker class; `self` is the worker (has `model_runner`, `vllm_config`)."""

    def _rlft_base(self) -> dict[str, torch.Tensor]:
        base = getattr(self, "_rlft_base_weights", None)
        if base is None:
            from safetensors.torch import load_file

            folder = Path(self.vllm_config.model_config.model)
            if not folder.is_dir():
                raise RuntimeError(f"lora_mode=merged needs a local model folder, got {folder}")
            base = {}
            for f in sorted(folder.glob("*.safetensors")):
                for name, t in load_file(str(f)).items():
                    if name.endswith("_proj.weight"):
                        base[name] = t
            self._rlft_base_weights = base
        return base

    def rlft_merge_adapter(self, config: dict, weights: bytes) -> dict:
        """Set the weights to base + this adapter's delta (None weights = back to the base model)."""
        from safetensors.torch import load as load_safetensors

        t0 = time.perf_counter()
        factors = lora_factors(config, load_safetensors(weights)) if weights else ({}, 1.0)
        payload = merged_payload(self._rlft_base(), *factors)
        self._rlft_reload(payload)
        return {"tensors": len(payload), "seconds": time.perf_counter() - t0}

    def rlft_load_weights(self, weights: bytes) -> dict:
        """Load full weights (HF names, safetensors bytes) in place: a full fine-tuning learner's sync.

        The bytes arrive through Ray's object store (no shared filesystem, any device). On CUDA, vLLM's native
        weight-transfer engines (NCCL / IPC) would avoid the host copy; this path works everywhere."""
        from safetensors.torch import load as load_safetensors

        t0 = time.perf_counter()
        payload = list(load_safetensors(weights).items())
        self._rlft_reload(payload)
        return {"tensors": len(payload), "seconds": time.perf_counter() - t0}

    def _rlft_reload(self, payload: list[tuple[str, torch.Tensor]]) -> None:
        """Load (HF name, tensor) pairs in place through vLLM's layerwise reload (re-runs weight packing)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        model = self.model_runner.model
        # Layers the payload does not touch (norms, embeddings) keep their tensors; vLLM warns once per such
        # layer ("Failed to load weights"), which is expected here and would flood the log every step.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        initialize_layerwise_reload(model)
        model.load_weights(weights=payload)
        finalize_layerwise_reload(model, self.vllm_config.model_config)
