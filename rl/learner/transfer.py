"""Host-to-GPU copies of a micro-batch's inputs that do not make the CPU wait for the GPU.

A plain `tensor.to("cuda")` from ordinary (pageable) host memory synchronises the stream: the CPU waits until every
kernel queued before it has run. Between micro-batches that is the previous backward, so the GPU would drain its
queue and idle while the CPU launches the next forward, once per micro-batch. From pinned memory the copy is queued
behind the running work like a kernel; PyTorch's pinned-memory cache keeps the host block until that copy has run.
"""

from __future__ import annotations

import torch


def upload(x: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`x` (a host tensor) on `device`; on a CUDA device without a stream synchronisation."""
    device = torch.device(device)
    if device.type != "cuda":
        return x.to(device)
    # contiguous first: pinning copies into a buffer of the same strides, where an expanded tensor's elements overlap
    return x.contiguous().pin_memory().to(device, non_blocking=True)
