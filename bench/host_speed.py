"""A machine's speed at the work that bounds a small model's RL step: the host's Python (the engine's scheduling and
output handling, the driver, the learner's op dispatch) and the GPU's kernel launches. Two lent machines with the same
GPU ran the GPU demo's solo step 1.8 times apart (docs/benchmarks.md#sweep-packs), which the GPU's name does not
show: bench.packs records this per part, so that a comparison across machines says how far apart they ran."""

from __future__ import annotations

import json
import subprocess
import sys

# the measure, in a fresh process of its own (bench.packs's parent process must not hold a CUDA context)
_SPEED_CODE = """
import json, sys, time
def best(f, n=5):
    times = []
    for _ in range(n):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    return min(times)
def loop():
    s = 0
    for i in range(1_000_000):
        s += i * i
out = {"python_ms": round(best(loop) * 1e3, 1)}
if sys.argv[1] == "cuda":
    import torch
    x = torch.zeros(16, device="cuda")
    def launches():
        for _ in range(2000):
            x.add_(1)
        torch.cuda.synchronize()
    launches()
    out["launch_us"] = round(best(launches) / 2000 * 1e6, 2)
print(json.dumps(out))
"""


def host_speed(cuda: bool) -> dict:
    """How fast this machine runs the work a small model's step is bound by, in about 5 s: the best of 5 runs of a
    fixed pure-Python loop (ms) and, with a GPU, of 2000 tiny CUDA kernel launches (µs each); {} where the measuring
    process fails."""
    cmd = [sys.executable, "-c", _SPEED_CODE, "cuda" if cuda else "cpu"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return {}
