"""What `run.deterministic=true` costs per step: the same run with it off and on, each a fresh train.py process.

python -m bench.deterministic [--repeats 3] [--steps 5] [--out DIR] [-- extra train.py overrides]

Defaults to the CPU demo's run (SmolLM2-135M-Instruct, chain_sum, one vLLM actor and one LoRA learner on a local
Ray) shortened to --steps steps without evaluation or checkpoints; on a GPU machine pass its overrides after `--`
(e.g. `-- +experiment=gpu_smollm2_chain_sum`). The sides alternate (off, on, off, on, ...) so that a machine
getting slower or faster weighs on both. Per run: the median step time over steps 2..N (step 1 compiles and warms
up), its rollout and learner parts; printed as one JSON line per run, then each side's median and spread over the
repeats and the ratio on/off.

What deterministic mode changes (docs/configuration.md, `run.deterministic`): deterministic torch kernels in the
learner (cuBLAS's fixed workspace on GPUs), vLLM's batch-invariant kernels on GPUs, padded learner micro-batches on
GPUs, and every generate call starting from an empty prefix cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import REPO, append_result, show_spread, spread
from rl.run_files import read_metrics
from tests.helpers import repo_env


def train_args(deterministic: bool, run_dir: Path, args: argparse.Namespace) -> list[str]:
    return [
        f"run.output_dir={run_dir}",
        f"run.steps={args.steps}",
        f"run.deterministic={str(deterministic).lower()}",
        "eval.size=0",
        "checkpoint.interval=0",
        "logger=jsonl",
        "run.seed=0",
        *args.overrides,
    ]


def step_times(run_dir: Path) -> dict:
    rows = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in rows if "time/step_s" in r and r["step"] >= 2]
    if not steps:
        raise SystemExit(f"{run_dir}: no step after the first in metrics.jsonl")
    return {k: statistics.median(r[f"time/{k}_s"] for r in steps) for k in ("step", "rollout", "learn")}


def run(deterministic: bool, k: int, out: Path, args: argparse.Namespace) -> dict:
    run_dir = out / f"{'on' if deterministic else 'off'}{k}"
    proc = subprocess.run(
        [sys.executable, "train.py", *train_args(deterministic, run_dir, args)],
        cwd=REPO,
        env=repo_env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"train.py (run.deterministic={deterministic}) failed:\n{proc.stderr[-3000:]}")
    return {"deterministic": deterministic, "repeat": k, **step_times(run_dir)}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=None, help="where the runs go (default: a temp folder)")
    ap.add_argument("overrides", nargs="*", help="train.py overrides for both sides (after --)")
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2 (step 1 is left out)")
    out = Path(args.out or tempfile.mkdtemp(prefix="rlft-bench-deterministic-"))
    rows = []
    for k in range(args.repeats):
        for side in (False, True):
            rows.append(run(side, k, out, args))
            print(json.dumps(rows[-1]), flush=True)
    sides = {d: spread([r["step"] for r in rows if r["deterministic"] == d]) for d in (False, True)}
    for d, name in ((False, "off"), (True, "on")):
        parts = {p: statistics.median(r[p] for r in rows if r["deterministic"] == d) for p in ("rollout", "learn")}
        print(
            f"run.deterministic={name}: step {show_spread(sides[d], ' s', 2)}, rollout {parts['rollout']:.2f} s, "
            f"learn {parts['learn']:.2f} s"
        )
    ratio = sides[True]["median"] / sides[False]["median"]
    print(f"on / off: {ratio:.2f}x the step time (medians)")
    append_result(
        "deterministic",
        {"on_over_off": round(ratio, 3), "step_s": {str(d).lower(): sides[d] for d in sides}, "runs": rows},
    )


if __name__ == "__main__":
    main()
