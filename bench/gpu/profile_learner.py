"""Where the Unsloth learner step's time goes (torch profiler, CUDA time by op), ours vs raw: diagnostics only."""
# ruff: noqa: I001  (unsloth must be imported before torch)

import sys

import unsloth  # noqa: F401

import torch
from torch.profiler import ProfilerActivity, profile

from bench.learner_backends import build_ours, build_raw


class A:
    backend, device, rank, batch, seq, vocab = "unsloth", "cuda", 16, 8, 1024, 32000


path = sys.argv[1]
for name, build in (("raw", build_raw), ("ours", build_ours)):
    obj, step = build(A, path)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    print("=====", name)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
    del obj, step
    torch.cuda.empty_cache()
