"""One GPU shared two ways, on the same work, each in a fresh train.py run: the 0.5/0.5 split (actor and learner
resident side by side in Ray bundles of half a GPU, conf/experiment/gpu_shared_qwen0.5b.yaml) against
`cluster.colocate=true` (they take turns: the engine sleeps while the learner trains, so each phase may use most of
the memory).

python -m bench.colocate --shape qwen2.5-7b [--steps 5] [--layouts split,colocate] [--override KEY=VALUE ...]

Per layout: the step's median and min-max over steps 2-N with its rollout / learn / sync parts, the engine's sleep and
wake, the learner's largest per-step peak memory, and vLLM's KV cache in tokens (its start-up line "KV cache size: N
tokens" in the actor's log, logs/actor0.log); then colocated over split. Each layout's row is also written to
`--out`/LAYOUT.json and the report reads every layout found there, so the two layouts may run in two calls of a
machine that stays up (`--layouts split`, then `--layouts colocate`: at 7B each starts a 15 GB engine and quantises
the learner's copy, minutes before the first step).

The work is bench/gpu/e2e.sh's: a random-init Qwen2.5 shape (bench/shapes.py; speed does not depend on the weights),
512 arithmetic questions (`write_arith_prompts`), the length reward of tests.helpers scaled to 2000 characters (a
random model is never right; lengths differ, so every group has signal and the learner does real work). CUDA only.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, append_result, show_spread, spread
from rl.run_files import read_metrics
from tests.helpers import LENGTH_REWARD, repo_env

# each layout's train.py overrides on top of the experiment; the shares are those of the 0.5B measurement in
# docs/benchmarks.md (vLLM 30% of the GPU beside the learner's half, 60% when it has the GPU to itself)
LAYOUTS = {
    "split": ["cluster.gpus_per_actor=0.5", "cluster.gpus_per_learner=0.5", "cluster.gpu_memory_utilization=0.3"],
    "colocate": [
        "cluster.colocate=true",
        "cluster.gpus_per_actor=1",
        "cluster.gpus_per_learner=1",
        "cluster.gpu_memory_utilization=0.6",
    ],
}
KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


def write_arith_prompts(path: str | Path, n: int = 512, seed: int = 0) -> Path:
    """`n` questions "What is a + b?" (a, b < 100) with their answers, one JSON object per line (env=jsonl)."""
    rng = random.Random(seed)
    path = Path(path)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randrange(100), rng.randrange(100)
            f.write(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
    return path


def train_args(layout: str, model: str, prompts: Path, out: Path, steps: int, overrides: list[str]) -> list[str]:
    """train.py's overrides for one layout: the experiment, the random shape, the e2e work, no eval or checkpoints."""
    return [
        "+experiment=gpu_shared_qwen0.5b",
        f"model.path={model}",
        "env=jsonl",
        f"env.train={prompts}",
        *LENGTH_REWARD,
        "+reward.scale=2000",
        "cluster.enforce_eager=false",
        # random weights, 4-bit learner against a bf16 engine: at 7B their logprobs differ by about 1.07 nats a token
        # before training, and that floor moved by up to 0.22 at a step with a working sync (docs/benchmarks.md); the
        # bench measures speed, so the probe keeps a wider margin than the default 0.2
        "run.sync_probe_threshold=0.5",
        f"run.steps={steps}",
        "logger=jsonl",
        f"run.output_dir={out}",
        f"hydra.run.dir={out}/hydra",
        *LAYOUTS[layout],
        *overrides,
    ]


def kv_cache_tokens(log: Path) -> int | None:
    """vLLM's KV-cache size in tokens from the actor's log (None when the line is not there)."""
    if not log.is_file():
        return None
    found = KV_LINE.findall(log.read_text(errors="replace"))
    return int(found[-1].replace(",", "")) if found else None


def model_folder(shape: str, models: str | Path, device: str = "cuda") -> Path:
    """The random shape's folder under `models`, built once by bench.shapes in its own process: this one would keep
    the weights' GPU memory in torch's cache through the runs it measures."""
    path = Path(models) / f"{shape}-v32000"
    if not (path / "config.json").is_file():
        cmd = [sys.executable, "-m", "bench.shapes", shape, str(path), "--device", device]
        subprocess.run(cmd, cwd=REPO, env=repo_env(), check=True, stdout=subprocess.DEVNULL)
    return path


def machine_info() -> dict:
    """bench.common.machine() from a child process: asking torch for the GPU's name would put a CUDA context (and
    its memory) in this process, beside the runs being measured."""
    code = "import json; from bench.common import machine; print(json.dumps(machine()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=repo_env(), capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else {}


def summarise(layout: str, out: Path, wall_s: float) -> dict:
    """One layout's row from its run folder: steps 2-N (the first pays compilation and the first sync)."""
    rows = read_metrics(out / "metrics.jsonl")
    rows = [r for r in rows if "time/step_s" in r]
    steady = rows[1:] or rows

    def part(key: str) -> dict | None:
        values = [r[key] for r in steady if key in r]
        return spread([round(v, 3) for v in values]) if values else None

    return {
        "bench": "colocate",
        "layout": layout,
        "steps": len(rows),
        "step_s": part("time/step_s"),
        "rollout_s": part("time/rollout_s"),
        "learn_s": part("time/learn_s"),
        "sync_s": part("time/sync_s"),
        "actor_sleep_s": part("time/actor_sleep_s"),
        "actor_wake_s": part("time/actor_wake_s"),
        "learner_peak_gib": max(
            (r["memory/learner_peak_gb"] for r in rows if "memory/learner_peak_gb" in r), default=None
        ),
        "kv_cache_tokens": kv_cache_tokens(out / "logs" / "actor0.log"),
        "startup_s": round(wall_s - sum(r["time/step_s"] for r in rows), 1),
        "machine": machine_info(),
    }


def run_layout(layout: str, model: str, prompts: Path, out: Path, steps: int, overrides: list[str]) -> dict:
    run = out / layout
    if run.exists():  # a fresh run, not a resume of an earlier call's
        shutil.rmtree(run)
    cmd = [sys.executable, str(REPO / "train.py"), *train_args(layout, model, prompts, run, steps, overrides)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=repo_env())
    if proc.returncode != 0:
        raise SystemExit(f"bench.colocate: the {layout} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    row = summarise(layout, run, time.perf_counter() - t0)
    (out / f"{layout}.json").write_text(json.dumps(row))
    return row


def show(s: dict | None, digits: int = 2) -> str:
    """bench.common.show_spread of a part, "-" for a part the layout does not have (sleep and wake when split)."""
    return show_spread(s, "", digits) if s else "-"


def report(out: Path, shape: str) -> dict:
    """The markdown rows of every layout with a row in `out`, and colocated over split where both are there (also
    returned)."""
    rows = {
        name: json.loads((out / f"{name}.json").read_text()) for name in LAYOUTS if (out / f"{name}.json").is_file()
    }
    print("| layout | vLLM KV cache | step, median (min-max) | rollout | learn | sync | sleep / wake | learner peak |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        kv = f"{r['kv_cache_tokens']:,} tokens" if r["kv_cache_tokens"] else "-"
        peak = f"{r['learner_peak_gib']:.2f} GiB" if r["learner_peak_gib"] is not None else "-"
        sleep = f"{show(r['actor_sleep_s'], 3)} / {show(r['actor_wake_s'], 3)}" if r["actor_sleep_s"] else "-"
        print(
            f"| {name} ({shape}, {r['machine'].get('gpu', 'no GPU')}, {r['machine'].get('date', '')}) | {kv} | "
            f"{show(r['step_s'])} s | {show(r['rollout_s'])} | {show(r['learn_s'])} | {show(r['sync_s'])} | {sleep} | {peak} |"
        )
    if len(rows) == 2:
        split, coloc = rows["split"], rows["colocate"]
        ratios = {"split_step_over_colocated_step": round(split["step_s"]["median"] / coloc["step_s"]["median"], 2)}
        if split["kv_cache_tokens"] and coloc["kv_cache_tokens"]:
            ratios["colocated_kv_over_split_kv"] = round(coloc["kv_cache_tokens"] / split["kv_cache_tokens"], 2)
        print(json.dumps({"bench": "colocate", "shape": shape, "ratios": ratios}), flush=True)
        return ratios
    return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2.5-0.5b", help="a bench/shapes.py shape (random weights, 32k vocabulary)")
    ap.add_argument("--steps", type=int, default=5, help="train.py steps per layout (the report uses steps 2-N)")
    ap.add_argument("--layouts", default="split,colocate", help=f"which of {', '.join(LAYOUTS)} to run, in this order")
    ap.add_argument("--override", action="append", default=[], help="one more train.py override for both layouts")
    ap.add_argument("--out", default="/tmp/bench-colocate", help="run folders and each layout's row")
    ap.add_argument("--models", default="/tmp/shapes", help="where the random shape's folder is built once")
    args = ap.parse_args()
    layouts = args.layouts.split(",")
    unknown = [x for x in layouts if x not in LAYOUTS]
    if unknown:
        raise SystemExit(f"--layouts: unknown {unknown} (choose from {', '.join(LAYOUTS)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(model_folder(args.shape, args.models))
    prompts = write_arith_prompts(out / "arith.jsonl")
    rows = {}
    for layout in layouts:
        rows[layout] = run_layout(layout, model, prompts, out, args.steps, args.override)
        print(json.dumps(rows[layout]), flush=True)
    ratios = report(out, args.shape)
    append_result(
        "colocate", {"shape": args.shape, "layouts": rows, "ratios": ratios}, info=rows[layouts[0]]["machine"]
    )


if __name__ == "__main__":
    main()
