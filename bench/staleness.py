"""Step time with synchronous rollouts (cluster.staleness=0) against one step of overlap (staleness=1).

python -m bench.staleness [--model PATH] [--steps 10] [--prompts 4] [--group-size 8] [--max-new-tokens 32]
    [--lr 0.002] [--out DIR]

Runs train.py twice on the same work and seed: 2 vLLM rollout actors + 1 LoRA learner on a local Ray (conf
cluster/2a1l), one CPU thread per role, the tiny random test model (built under --out if --model is not given)
and the length reward of tests/helpers.py (its samples differ, so the policy has something to learn). Prints one
JSON line per run and a markdown row: mean step time over steps 2..N (step 1 cannot overlap anything), the
speed-up, each run's reward over its first and last three steps, and the roles' idle fractions.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import REPO, append_result
from rl.run_files import read_metrics
from tests.helpers import LENGTH_REWARD, repo_env


def train_args(staleness: int, model: Path, run_dir: Path, args: argparse.Namespace) -> list[str]:
    """train.py's overrides for one side (the vLLM memory share derived from this machine, bench/common.py)."""
    from bench.common import vllm_memory_fraction
    from rl.config.schema import ModelConfig

    sequences = math.ceil(args.prompts * args.group_size / 2)  # per actor
    seq_len = ModelConfig().max_prompt_tokens + args.max_new_tokens
    share = vllm_memory_fraction(str(model), sequences, seq_len, dtype="float32")
    return [
        f"model.path={model}",
        f"run.output_dir={run_dir}",
        "cluster=2a1l",
        f"cluster.staleness={staleness}",
        "cluster.actor_threads=1",
        "cluster.learner_threads=1",
        f"cluster.gpu_memory_utilization={share}",
        f"run.steps={args.steps}",
        f"run.prompts_per_step={args.prompts}",
        f"algorithm.group_size={args.group_size}",
        f"algorithm.lr={args.lr}",
        f"model.max_new_tokens={args.max_new_tokens}",
        "model.dtype=float32",
        "model.learner_dtype=float32",
        *LENGTH_REWARD,
        "eval.size=0",
        "checkpoint.interval=0",
        "logger=none",
        "run.seed=0",
    ]


def run(staleness: int, model: Path, out: Path, args: argparse.Namespace) -> dict:
    run_dir = out / f"staleness{staleness}"
    cmd = [sys.executable, str(REPO / "train.py"), *train_args(staleness, model, run_dir, args)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=repo_env())
    if proc.returncode != 0:
        raise SystemExit(f"staleness={staleness} failed:\n{proc.stderr[-3000:]}")
    rows = read_metrics(run_dir / "metrics.jsonl")
    rows = [r for r in rows if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in rows]
    later = rows[1:]
    return {
        "bench": "staleness",
        "staleness": staleness,
        "steps": len(rows),
        "step_s_mean": round(statistics.mean(r["time/step_s"] for r in later), 2),
        "train_s": round(json.loads((run_dir / "summary.json").read_text())["time/train_s"], 1),
        "reward_first3": round(statistics.mean(rewards[:3]), 3),
        "reward_last3": round(statistics.mean(rewards[-3:]), 3),
        "actor_idle_frac": round(statistics.mean(r["perf/actor_idle_frac"] for r in later), 2),
        "learner_idle_frac": round(statistics.mean(r["perf/learner_idle_frac"] for r in later), 2),
        "rollout_wait_s": round(statistics.mean(r["time/rollout_s"] for r in later), 2),
        "learn_s": round(statistics.mean(r["time/learn_s"] for r in later), 2),
        "dropped_stale": sum(r["async/dropped_stale"] for r in rows),
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="HF folder (default: the tiny random test model)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    return ap


def main() -> None:
    args = parser().parse_args()

    out = Path(args.out or tempfile.mkdtemp(prefix="bench-staleness-"))
    if args.model:
        model = Path(args.model)
    else:
        sys.path.insert(0, str(REPO))
        from tests.helpers import build_tiny_model

        model = build_tiny_model(out / "tiny-llama")
    results = {}
    for k in (0, 1):
        results[k] = run(k, model, out, args)
        print(json.dumps(results[k]), flush=True)
    a, b = results[0], results[1]
    print(
        f"| 2 actors + 1 learner (1 thread each), tiny model, {args.steps} steps x {args.prompts} prompts x "
        f"{args.group_size} samples x {args.max_new_tokens} tokens | staleness 0: {a['step_s_mean']} s/step, "
        f"staleness 1: {b['step_s_mean']} s/step (**{a['step_s_mean'] / b['step_s_mean']:.2f}x**) | reward "
        f"{a['reward_first3']} -> {a['reward_last3']} (k=0), {b['reward_first3']} -> {b['reward_last3']} (k=1) | "
        f"idle actor/learner: k=0 {a['actor_idle_frac']}/{a['learner_idle_frac']}, "
        f"k=1 {b['actor_idle_frac']}/{b['learner_idle_frac']} |"
    )
    speedup = round(a["step_s_mean"] / b["step_s_mean"], 2)
    append_result("staleness", {"staleness_0": a, "staleness_1": b, "step_speedup_1_over_0": speedup})


if __name__ == "__main__":
    main()
