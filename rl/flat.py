"""Many tensors as one contiguous buffer and back: the layout the learner's LoRA factors leave it in. One buffer
is one device-to-host copy for the bytes sync (hundreds of small copies, each a synchronisation, otherwise) and
one CUDA IPC handle for the same-GPU sync (`cluster.weight_sync=ipc`). The learner packs, the rollout engine's
worker unpacks; neither imports the other, so the format lives here."""

from __future__ import annotations

import torch


def pack(tensors: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[str], list[list[int]]]:
    """(one 1-D buffer on the tensors' device, names, shapes); the tensors must share a dtype."""
    dtypes = {t.dtype for _, t in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"pack needs one dtype, got {sorted(str(d) for d in dtypes)}")
    flat = torch.cat([t.detach().reshape(-1) for _, t in tensors])
    return flat, [k for k, _ in tensors], [list(t.shape) for _, t in tensors]


def unpack(flat: torch.Tensor, names: list[str], shapes: list[list[int]]) -> dict[str, torch.Tensor]:
    """`pack`'s tensors as views of `flat` (no copy)."""
    out, start = {}, 0
    for name, shape in zip(names, shapes, strict=True):
        n = 1
        for d in shape:
            n *= d
        out[name] = flat[start : start + n].view(shape)
        start += n
    if start != flat.numel():
        raise ValueError(f"the layout covers {start} elements of a {flat.numel()}-element buffer")
    return out
