"""vLLM worker extension: load a LoRA adapter version by merging it into the engine's base weights.

`cluster.lora_mode=merged` (what `auto` picks): the actor receives the adapter bytes and computes
W = W0 + (alpha / r) * B @ A for every targeted projection. Two ways to write W:
- in place (`InPlaceMerge`), where the engine's weights are what its kernels read: a CUDA engine on one GPU with
  unquantized linear layers (their post-load processing does nothing there). Each touched parameter (a fused qkv_proj
  or gate_up_proj whole) is copied back from a pinned host snapshot of the engine's own start-up weights, then each
  projection's rows get `addmm_(B, A)`: no allocation, no reload, the tensors CUDA graphs point to stay.
- otherwise through vLLM's layerwise reload (`merged_payload`: CPU, where the weights are repacked into GEMM handles;
  tensor parallel; quantized layers), which re-runs the kernels' weight packing; untargeted siblings of a fused layer
  (q/k/v in qkv_proj, gate/up in gate_up_proj) are sent with their base values so every fused layer is complete.
vLLM's native LoRA path (`LoRARequest`, `cluster.lora_mode=native`) applies the adapter at every decode step
instead, which decodes slower on both CPU and GPU (docs/benchmarks.md).

Loaded by vLLM inside its worker process (`LLM(worker_extension_cls="rl.rollout.vllm_ext.LoraMergeExtension")`) and
called through `llm.collective_rpc("rlft_merge_adapter", args=(...))`; method names carry an `rlft_` prefix so
they cannot clash with the worker's own. `rlft_merge_adapter_ipc` merges factors read from the learner's GPU memory
(one GPU, `cluster.weight_sync=ipc`); `rlft_load_weights` loads a full fine-tuning learner's weights.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from rl.flat import unpack

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


def merged_payload(
    base: dict[str, torch.Tensor],
    factors: dict[str, tuple],
    scale: float,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF weight name, merged tensor) for every projection the adapter touches, with the untargeted siblings of a
    fused vLLM layer at their base values; no factors = every base projection (back to the base model).

    Lazy and in name order (each decoder layer's tensors together), so vLLM's layerwise reload holds about one
    layer at a time. With `device` (the engine's GPU) each base tensor is copied there and merged there: the
    addmm runs on the GPU and only the base weights cross the bus (from pinned memory, see `_rlft_base`).
    `dtype`: the engine's weights dtype, which the merge runs in. The checkpoint's may be narrower (a bf16 file
    served in fp32): merged in the file's bf16, each delta was rounded to the base weight's bf16 spacing, and the
    CPU demo's fp32 actor sampled 0.04-0.07 nats per token away from its fp32 learner (probe 0.0000 on the base)."""
    names: set[str] = set()
    for module in factors:
        prefix, _, proj = module.rpartition(".")
        group = _FUSED.get(proj)
        names.update(f"{prefix}.{s}.weight" for s in (_SIBLINGS[group] if group else (proj,)))
    if not factors:  # back to the base: reload every projection that an earlier adapter may have changed
        names = set(base)
    missing = sorted(names - set(base))
    if missing:
        raise KeyError(f"adapter targets {missing[0]}, which the base checkpoint does not have")
    if device is not None:
        factors = {m: (b.to(device), a.to(device)) for m, (b, a) in factors.items()}

    def merged() -> Iterator[tuple[str, torch.Tensor]]:  # checked above, before the reload takes the model apart
        for name in sorted(names):
            w0, ba = base[name], factors.get(name.removesuffix(".weight"))
            if device is not None or dtype is not None:
                w0 = w0.to(device or w0.device, dtype or w0.dtype, non_blocking=True)
            yield name, (w0 if ba is None else merge_lora(w0, *ba, scale))

    return merged()


class InPlaceMerge:
    """W0 + scale * B @ A written straight into the engine's parameters, for engines whose kernels read the
    parameters as loaded (`kernel_slices` says which). `slices`: HF weight name -> (the engine's parameter, first
    row, rows) — a fused parameter holds several projections' rows. W0 is a snapshot of the parameters taken at
    construction, before any adapter (pinned host memory on a GPU: asynchronous copies back, no GPU memory)."""

    def __init__(self, slices: dict[str, tuple[torch.Tensor, int, int]]):
        self.slices = slices
        self.params = {id(p): p for p, _, _ in slices.values()}
        pin = any(p.is_cuda for p in self.params.values())
        self.base = {
            k: (p.detach().to("cpu", copy=True).pin_memory() if pin else p.detach().clone())
            for k, p in self.params.items()
        }
        self.dirty: set[int] = set()  # parameters that hold a delta now

    def write(self, factors: dict[str, tuple], scale: float) -> int:
        """Set every parameter the adapter (or the previous one) touches to W0 + its delta; returns their number."""
        names = {f"{module}.weight": ba for module, ba in factors.items()}
        missing = sorted(set(names) - set(self.slices))
        if missing:
            raise KeyError(f"adapter targets {missing[0]}, which the engine has no unquantized projection for")
        touched = {id(self.slices[n][0]) for n in names}
        with torch.no_grad():
            for k in touched | self.dirty:
                self.params[k].copy_(self.base[k], non_blocking=True)
            for name, (b, a) in names.items():
                p, row, rows = self.slices[name]
                p[row : row + rows].addmm_(b.to(p.device, p.dtype), a.to(p.device, p.dtype), alpha=scale)
        written, self.dirty = touched | self.dirty, touched
        return len(written)


def kernel_slices(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, int, int]] | None:
    """HF projection weight name -> (vLLM parameter, first row, rows) for every `*_proj` linear layer of a vLLM
    model on one tensor-parallel rank, using the model's `packed_modules_mapping` and the fused layers'
    `output_sizes` (qkv_proj = q, k, v rows in that order). None when a projection is quantized or has no plain
    weight (then only the layerwise reload knows the kernels' layout)."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    packed = getattr(model, "packed_modules_mapping", None) or {}
    out: dict[str, tuple[torch.Tensor, int, int]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase) or not name.endswith("_proj"):
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(module.quant_method, UnquantizedLinearMethod) or not isinstance(weight, torch.Tensor):
            return None
        prefix, _, leaf = name.rpartition(".")
        subs, sizes = packed.get(leaf), getattr(module, "output_sizes", None)
        if not subs:
            subs, sizes = [leaf], [weight.shape[0]]
        if sizes is None or len(subs) != len(sizes) or sum(sizes) != weight.shape[0]:
            return None
        row = 0
        for sub, size in zip(subs, sizes):
            out[f"{prefix}.{sub}.weight" if prefix else f"{sub}.weight"] = (weight, row, size)
            row += size
    return out or None


class LoraMergeExtension:
    """Mixed into vLLM's worker class; `self` is the worker (has `model_runner`, `vllm_config`)."""

    def _rlft_base_files(self) -> list[Path]:
        """The base checkpoint's safetensors files: from the model folder, or the hub snapshot vLLM loaded."""
        mc = self.vllm_config.model_config
        folder = Path(mc.model)
        if not folder.is_dir():  # a hub id: vLLM has it in the local HF cache by now
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(mc.model, revision=mc.revision, allow_patterns=["*.safetensors"]))
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise RuntimeError(
                f"cluster.lora_mode=merged needs the base weights as *.safetensors, and {folder} has none: "
                "re-save the model with save_pretrained() or set cluster.lora_mode=native"
            )
        return files

    def _rlft_base(self) -> dict[str, torch.Tensor]:
        base = getattr(self, "_rlft_base_weights", None)
        if base is None:
            from safetensors.torch import load_file

            base = {}
            pin = self._rlft_device() is not None
            for f in self._rlft_base_files():
                for name, t in load_file(str(f)).items():
                    if name.endswith("_proj.weight"):
                        base[name] = t.pin_memory() if pin else t  # pinned: asynchronous copies to the GPU
            self._rlft_base_weights = base
        return base

    def rlft_prepare_merge(self) -> dict:
        """Take the base projections now, at engine start: a snapshot of the engine's own weights where merges
        write in place (`_rlft_in_place_slices`), else read from the checkpoint (pinned on a GPU). A missing
        checkpoint fails here and not at the first adapter sync, and the first sync is as fast as the later ones
        (the reload's modules are imported here too: their import is slow enough to show in a sync's time,
        docs/benchmarks.md)."""
        import vllm.model_executor.model_loader.reload  # noqa: F401 - imported for `_rlft_reload`'s first call

        t0 = time.perf_counter()
        slices = self._rlft_in_place_slices()
        self._rlft_in_place = InPlaceMerge(slices) if slices is not None else None
        if slices is not None:
            return {"tensors": len(slices), "seconds": time.perf_counter() - t0, "in_place": True}
        base = self._rlft_base()
        return {"tensors": len(base), "seconds": time.perf_counter() - t0, "in_place": False}

    def _rlft_in_place_slices(self) -> dict[str, tuple[torch.Tensor, int, int]] | None:
        """`kernel_slices` where an in-place merge is right: a CUDA engine on one GPU whose projections are exactly
        the checkpoint's (names and shapes, read from the safetensors headers: no remapped or padded layer)."""
        device = self._rlft_device()
        parallel = self.vllm_config.parallel_config
        if device is None or device.type != "cuda" or parallel.world_size != 1:
            return None
        slices = kernel_slices(self.model_runner.model)
        if slices is None:
            return None
        from safetensors import safe_open

        shapes = {}
        for f in self._rlft_base_files():
            with safe_open(str(f), framework="pt") as st:
                shapes |= {k: list(st.get_slice(k).get_shape()) for k in st.keys() if k.endswith("_proj.weight")}
        mine = {name: [rows, p.shape[1]] for name, (p, _, rows) in slices.items()}
        return slices if mine == shapes else None

    def _rlft_device(self) -> torch.device | None:
        """The engine's accelerator, where merges run; None on CPU (merge in place on the host tensors)."""
        device = next(self.model_runner.model.parameters()).device
        return device if device.type != "cpu" else None

    def rlft_merge_adapter(self, config: dict, weights: bytes) -> dict:
        """Set the weights to base + this adapter's delta (None weights = back to the base model)."""
        from safetensors.torch import load as load_safetensors

        t0 = time.perf_counter()
        factors = lora_factors(config, load_safetensors(weights)) if weights else ({}, 1.0)
        return self._rlft_merge(*factors) | {"seconds": time.perf_counter() - t0}

    def rlft_merge_adapter_ipc(self, info: dict) -> dict:
        """Merge an adapter whose factors stay in the learner's GPU memory (`cluster.weight_sync=ipc`): open its
        packed buffer from the CUDA IPC handle (`IpcExport.adapter_handles`) and merge from it. The buffer is not
        referenced after this returns, so the learner may free it."""
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        t0 = time.perf_counter()
        device = self._rlft_device()
        if device is None or device.type != "cuda":
            raise RuntimeError("cluster.weight_sync=ipc needs the rollout engine on a CUDA GPU")
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        args = info["ipc_handle"].get(uuid)
        if args is None:
            raise RuntimeError(
                f"cluster.weight_sync=ipc: the learner's adapter is on GPU {sorted(info['ipc_handle'])}, this rollout "
                f"engine on {uuid}: put the actor on its learner's GPU (cluster.colocate=true) or use "
                "cluster.weight_sync=object_store"
            )
        args = list(args)
        args[6] = device.index  # the rebuild's device index is the learner process's numbering: use this one's
        flat = rebuild_cuda_tensor(*args)
        factors = lora_factors(info["lora_config"], unpack(flat, info["names"], info["shapes"]))
        return self._rlft_merge(*factors) | {"seconds": time.perf_counter() - t0}

    def _rlft_merge(self, factors: dict[str, tuple], scale: float) -> dict:
        """Write base + scale * B @ A for `factors` (in place or through the layerwise reload), waiting for the GPU."""
        device = self._rlft_device()
        in_place = getattr(self, "_rlft_in_place", None)
        if in_place is not None:
            n = in_place.write(factors, scale)
        else:
            dtype = self.vllm_config.model_config.dtype
            counted = _Counted(merged_payload(self._rlft_base(), factors, scale, device=device, dtype=dtype))
            self._rlft_reload(counted)
            n = counted.n
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)  # the merge and copies are asynchronous: time them whole
        return {"tensors": n, "in_place": in_place is not None}

    def rlft_load_weights(self, weights: bytes) -> dict:
        """Load full weights (HF names, safetensors bytes) in place: a full fine-tuning learner's sync.

        The bytes arrive through Ray's object store (no shared filesystem, any device). On CUDA, vLLM's native
        weight-transfer engines (NCCL / IPC) would avoid the host copy; this path works everywhere."""
        from safetensors.torch import load as load_safetensors

        t0 = time.perf_counter()
        payload = list(load_safetensors(weights).items())
        self._rlft_reload(payload)
        if any(name.startswith(("model.embed_tokens.", "lm_head.")) for name, _ in payload):
            self._rlft_refresh_lm_head()
        return {"tensors": len(payload), "seconds": time.perf_counter() - t0}

    def _rlft_refresh_lm_head(self) -> None:
        """vLLM's CPU backend packs the LM head's weight into a GEMM handle when it loads the model. With tied
        embeddings the head is a module of its own that shares the embedding's tensor: the layerwise reload updates
        that tensor but, loading nothing into the head, keeps the head's handle on the old weights, so the logits
        came from the base model's head (full fine-tuning probe 0.004-0.011 on the tiny fp32 test model, 1e-7 after
        this). Re-run the head's post-load processing from its current tensor. GPUs hold no such handle."""
        from vllm.platforms import current_platform

        head = getattr(self.model_runner.model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if current_platform.is_cpu() and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)

    def _rlft_reload(self, payload: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (HF name, tensor) pairs in place through vLLM's layerwise reload (re-runs weight packing)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        model = self.model_runner.model
        # Layers the payload does not touch (norms, embeddings) keep their tensors; vLLM warns once per such
        # layer ("Failed to load weights"), which is expected here and would flood the log every step.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        initialize_layerwise_reload(model)
        model.load_weights(weights=payload)
        finalize_layerwise_reload(model, self.vllm_config.model_config)


class _Counted:
    """An iterable that counts what went through it (the reload consumes the payload lazily)."""

    def __init__(self, items: Iterable):
        self.items, self.n = items, 0

    def __iter__(self):
        for item in self.items:
            self.n += 1
            yield item
