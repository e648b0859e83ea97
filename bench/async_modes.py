"""Samples per second and held-out accuracy of the three rollout modes on the same work: synchronous
(cluster.staleness=0), one step of overlap (staleness=1) and continuous (cluster.rollout_mode=continuous, the
per-sample bound --bound).

python -m bench.async_modes [--repeats 2] [--steps 6] [--bound 1] [--modes sync,staleness1,continuous]
    [--out DIR] -- <train.py overrides: the workload>

Each run is a fresh train.py process (vLLM and the learner patch themselves at import); the modes alternate within a
repeat and their order rotates between repeats, so a machine's drift falls on all of them. Every mode runs the same
objective, the decoupled one continuous mode needs (algorithm.tis_cap=2, rl/algorithms/losses.py `importance_terms`), so
only the scheduling differs. Per run: trained samples per second of the training loop (steps x prompts x samples /
time/train_s, the first step included), the actors' generated tokens per second, held-out accuracy before and after
(the workload's eval settings), idle shares, stale groups dropped and samples continued across an update. Then per
mode the median and spread over the repeats, the samples/s ratio to the synchronous and to the staleness=1 median,
and the accuracy difference to the synchronous one.

A long-tailed workload shows what continuous mode is for: e.g. on one GPU
    python -m bench.async_modes -- +experiment=gpu_smollm2_chain_sum model.max_new_tokens=1024 ...
and on this CPU machine the embedded SmolLM2 with a few prompts (docs/benchmarks.md has the commands run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import REPO, append_result, median, show_spread, spread
from rl.run_files import read_metrics
from tests.helpers import repo_env

MODES = {
    "sync": ["cluster.staleness=0"],
    "staleness1": ["cluster.staleness=1"],
    "continuous": ["cluster.rollout_mode=continuous"],  # + cluster.staleness=<bound>
}


def mode_args(mode: str, bound: int) -> list[str]:
    return MODES[mode] + ([f"cluster.staleness={bound}"] if mode == "continuous" else [])


def train_args(mode: str, run_dir: Path, args: argparse.Namespace) -> list[str]:
    """train.py's overrides for one run: the workload, the mode, and what every mode shares."""
    return [
        *args.overrides,
        *mode_args(mode, args.bound),
        f"run.steps={args.steps}",
        "algorithm.tis_cap=2.0",
        "algorithm.updates_per_step=1",
        "eval.interval=0",
        "checkpoint.interval=0",
        "logger=jsonl",
        f"run.output_dir={run_dir}",
    ]


def run(mode: str, repeat: int, out: Path, args: argparse.Namespace) -> dict:
    run_dir = out / f"{mode}-{repeat}"
    cmd = [sys.executable, str(REPO / "train.py"), *train_args(mode, run_dir, args)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=repo_env())
    if proc.returncode != 0:
        raise SystemExit(f"{mode} (repeat {repeat}) failed:\n{proc.stderr[-3000:]}")
    rows = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in rows if "reward/mean" in r]
    summary = json.loads((run_dir / "summary.json").read_text())
    samples = samples_trained(steps)
    train_s = summary["time/train_s"]
    later = steps[1:] or steps  # step 1 holds each side's first compilations: the rates are over steps 2..N
    return {
        "bench": "async_modes",
        "mode": mode,
        "repeat": repeat,
        "steps": len(steps),
        "samples": samples,
        "train_s": round(train_s, 1),
        "samples_per_s": round(samples_trained(later) / sum(r["time/step_s"] for r in later), 2),
        "samples_per_s_all_steps": round(samples / train_s, 2),
        "actor_tokens_per_s": round(
            sum(r["data/generated_tokens"] for r in later) / sum(r["time/step_s"] for r in later), 1
        ),
        "accuracy_before": summary.get("eval/accuracy_before"),
        "accuracy_after": summary.get("eval/accuracy_after"),
        "response_len_mean": round(statistics.mean(r["response/length_mean"] for r in steps), 1),
        "response_len_max": max(r["response/length_max"] for r in steps),
        "actor_idle_frac": round(statistics.mean(r["perf/actor_idle_frac"] for r in later), 2),
        "learner_idle_frac": round(statistics.mean(r["perf/learner_idle_frac"] for r in later), 2),
        "dropped_stale_groups": sum(r.get("async/dropped_stale_groups", 0) for r in steps),
        "dropped_stale_samples": sum(r.get("async/dropped_stale", 0) for r in steps),
        "partial_rollouts": sum(r.get("async/partial_rollouts", 0) for r in steps),
        "staleness_max": max(r["async/staleness_max"] for r in steps),
    }


def samples_trained(steps: list[dict]) -> float:
    """Samples the learners took over the run: each step's rate times its time (train.py logs both)."""
    return round(sum(r["perf/samples_per_s"] * r["time/step_s"] for r in steps))


def table(results: list[dict], modes: list[str]) -> str:
    """Per mode: samples/s (median, spread), its ratio to sync's and staleness1's medians, held-out accuracy after
    (median, each run) and its difference to sync's, idle shares, dropped groups and partial rollouts."""
    by = {m: [r for r in results if r["mode"] == m] for m in modes}
    rate = {m: median([r["samples_per_s"] for r in rs]) for m, rs in by.items() if rs}
    acc = {
        m: median([r["accuracy_after"] for r in rs if r["accuracy_after"] is not None] or [float("nan")])
        for m, rs in by.items()
        if rs
    }

    def ratio(m: str, base: str) -> str:
        return f"{rate[m] / rate[base]:.2f}x" if base in rate else "-"

    lines = [
        "| mode | samples/s | vs sync | vs staleness 1 | held-out after | vs sync | actor / learner idle "
        "| dropped stale groups | partial rollouts |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m, rs in by.items():
        if not rs:
            continue
        runs = ", ".join(f"{r['accuracy_after']:.3f}" for r in rs if r["accuracy_after"] is not None)
        delta = f"{acc[m] - acc['sync']:+.3f}" if "sync" in acc else "-"
        idle = f"{statistics.mean(r['actor_idle_frac'] for r in rs):.2f} / "
        idle += f"{statistics.mean(r['learner_idle_frac'] for r in rs):.2f}"
        lines.append(
            f"| {m} | {show_spread(spread([r['samples_per_s'] for r in rs]), digits=2)} | {ratio(m, 'sync')} | "
            f"{ratio(m, 'staleness1')} | {acc[m]:.3f} ({runs}) | {delta} | {idle} | "
            f"{sum(r['dropped_stale_groups'] for r in rs):.0f} | {sum(r['partial_rollouts'] for r in rs):.0f} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--bound", type=int, default=1, help="continuous mode's cluster.staleness")
    ap.add_argument("--modes", default="sync,staleness1,continuous")
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("overrides", nargs="*", help="train.py overrides after --: the workload")
    return ap


def main() -> None:
    args = parser().parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-async-"))
    modes = args.modes.split(",")
    results = []
    for repeat in range(args.repeats):
        order = modes[repeat % len(modes) :] + modes[: repeat % len(modes)]
        for mode in order:
            results.append(run(mode, repeat, out, args))
            print(json.dumps(results[-1]), flush=True)
    print(table(results, modes))
    append_result("async_modes", {"runs": results})


if __name__ == "__main__":
    main()
