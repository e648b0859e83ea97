"""What leaves the learner: the policy update as bytes (adapter or full weights), CUDA IPC handles, and the
training state a checkpoint keeps. Plain functions of a model and an optimizer."""

from __future__ import annotations

import io
import json
import weakref
from typing import Any

import torch

from rl.flat import pack, unpack
from rl.types import Adapter


def policy_bytes(model: Any, version: int, *, full_weights: bool, dtype: torch.dtype | None = None) -> Adapter:
    """The current policy update as bytes: the LoRA adapter in PEFT format (adapter_config.json + safetensors), or
    with full fine-tuning every parameter under its HF name (config `full_weights: true`; tied parameters once, as
    `named_parameters` lists them). `dtype`: the LoRA factors rounded to it (the rollout engine's, which rounds them
    on load anyway: half the bytes for a bf16 engine)."""
    from safetensors.torch import save

    if full_weights:
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.named_parameters()}
        config = {"full_weights": True, "dtype": str(next(iter(state.values())).dtype).removeprefix("torch.")}
        return Adapter(version=version, config=config, weights=save(state))
    tensors = adapter_tensors(model, dtype)
    return Adapter(version=version, config=adapter_config(model), weights=save(to_host(tensors)))


def adapter_tensors(model: Any, dtype: torch.dtype | None) -> list[tuple[str, torch.Tensor]]:
    """The adapter's tensors under their PEFT keys, on the learner's device, rounded to `dtype` there (half the
    bytes cross to the host or to the engine, no conversion on the other side)."""
    return [(k, v.detach().to(dtype) if dtype is not None else v.detach()) for k, v in lora_tensors(model)]


def adapter_config(model: Any) -> dict:
    return plain_config(model.peft_config["default"].to_dict())


_LORA_TENSORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lora_tensors(model: Any) -> list[tuple[str, torch.Tensor]]:
    """(PEFT state-dict key, parameter) for every tensor of the adapter, found once per model: PEFT's
    `get_peft_model_state_dict` walks the whole model's state dict (the 4-bit base too), 0.07 s per sync on
    SmolLM2. The parameters are the live ones (training and `load_policy_bytes` update them in place); a key that
    is not a parameter (a buffer) makes every call ask PEFT again."""
    cached = _LORA_TENSORS.get(model)
    if cached is not None:
        return cached
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model)
    by_storage = {(p.data_ptr(), p.shape): p for _, p in model.named_parameters()}
    params = [(k, by_storage.get((v.data_ptr(), v.shape))) for k, v in state.items()]
    if any(p is None for _, p in params):
        return list(state.items())
    _LORA_TENSORS[model] = params
    return params


def to_host(tensors: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The tensors on the host in one device-to-host copy where they share a dtype (views of one flat buffer;
    hundreds of small copies, each a synchronisation, otherwise)."""
    if len({t.dtype for _, t in tensors}) != 1:
        return {k: t.to("cpu").contiguous() for k, t in tensors}
    flat, names, shapes = pack(tensors)
    return unpack(flat.to("cpu"), names, shapes)


def plain_config(config: dict) -> dict:
    """PEFT's adapter config as plain JSON data (what adapter_config.json holds): sets as sorted lists, enums
    (`peft_type`) as their string values. Whoever unpickles an Adapter (the driver, every actor) then needs no PEFT:
    a PEFT enum in it imported PEFT and transformers in the driver at the first sync, seconds of that sync
    (docs/benchmarks.md)."""
    return json.loads(json.dumps(config, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o)))


def load_policy_bytes(model: Any, adapter: Adapter, device: torch.device, *, full_weights: bool) -> None:
    """Copy `policy_bytes`' output back into the model's parameters, in place (an optimizer keeps its params)."""
    from safetensors.torch import load

    weights = {k: v.to(device) for k, v in load(adapter.weights).items()}
    if full_weights:
        missing = set(weights) ^ {k for k, _ in model.named_parameters()}
        if missing:
            raise ValueError(f"checkpoint weights do not match this model: {sorted(missing)[:5]} ...")
        with torch.no_grad():
            for k, p in model.named_parameters():
                p.copy_(weights[k])
        return
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, weights)


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> bytes:
    buf = io.BytesIO()
    torch.save(optimizer.state_dict(), buf)
    return buf.getvalue()


def load_optimizer_bytes(optimizer: torch.optim.Optimizer, data: bytes, device: torch.device) -> None:
    optimizer.load_state_dict(torch.load(io.BytesIO(data), map_location=device, weights_only=True))


class IpcExport:
    """The policy as CUDA IPC handles for actors on the learner's GPU (`cluster.weight_sync=ipc`); the tensors stay
    referenced, hence valid, until `release`. Full fine-tuning: every parameter, in the update format of vLLM's IPC
    weight-transfer engine (names, dtype names, shapes, {GPU uuid: rebuild args}). LoRA: the adapter's factors
    packed into one buffer (rl/flat.py) behind one handle, which the engine's worker merges
    (`rlft_merge_adapter_ipc` in rl/rollout/vllm_ext.py): no host copy, no serialisation, no object store."""

    def __init__(self):
        self._refs: list[torch.Tensor] = []

    def handles(self, model: Any, device: torch.device) -> dict:
        from torch.multiprocessing.reductions import reduce_tensor

        uuid = _gpu_uuid(device)
        self._refs = []
        info: dict = {"names": [], "dtype_names": [], "shapes": [], "ipc_handles": []}
        for name, p in model.named_parameters():
            t = p.detach().contiguous()
            self._refs.append(t)
            info["names"].append(name)
            info["dtype_names"].append(str(t.dtype).removeprefix("torch."))
            info["shapes"].append(list(t.shape))
            info["ipc_handles"].append({uuid: reduce_tensor(t)[1]})
        return info

    def adapter_handles(self, model: Any, device: torch.device, dtype: torch.dtype | None) -> dict:
        """The adapter's factors packed (a copy: the learner may step again while the actors read it)."""
        return self.packed_handles(adapter_tensors(model, dtype), adapter_config(model), device)

    def packed_handles(self, tensors: list[tuple[str, torch.Tensor]], config: dict, device: torch.device) -> dict:
        """{"lora_config", "names", "shapes", "ipc_handle": {GPU uuid: rebuild args}} of `tensors` (PEFT keys, on
        `device`) packed into one buffer."""
        from torch.multiprocessing.reductions import reduce_tensor

        uuid = _gpu_uuid(device)
        flat, names, shapes = pack(tensors)
        torch.cuda.synchronize(device)  # another process reads the buffer: the copy into it must have finished
        self._refs = [flat]
        return {"lora_config": config, "names": names, "shapes": shapes, "ipc_handle": {uuid: reduce_tensor(flat)[1]}}

    def release(self) -> None:
        self._refs = []
        torch.cuda.ipc_collect()


def _gpu_uuid(device: torch.device) -> str:
    if device.type != "cuda":
        raise RuntimeError("cluster.weight_sync=ipc needs the learner on a CUDA GPU")
    return str(torch.cuda.get_device_properties(device.index or torch.cuda.current_device()).uuid)
