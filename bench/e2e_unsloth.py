"""Ours against Unsloth's own GRPO recipe (what our users would otherwise pick for a 4-bit LoRA learner with vLLM
rollouts), each on one GPU, on the same work at a random Qwen2.5 shape (7B: this project's target; 0.5B).

python -m bench.e2e_unsloth --shape qwen2.5-7b [--sides unsloth,split,colocate] [--steps 5] [--repeats 1]
    [--prompts 32 --n 8 --max-tokens 512] [--unsloth-memory 0.5] [--standby] [--actor-memory F] [--report-only]
On the GPU machine, one side per 10-minute call: bash bench/gpu/e2e_unsloth.sh SHAPE SIDE (docs/benchmarks.md).

Unsloth's side, as its source at unsloth 2026.10.9 / unsloth_zoo 2026.10.9 / TRL 1.15.0 does it: `import unsloth`
first in a fresh process (it patches transformers, PEFT and TRL's trainers), FastLanguageModel.from_pretrained(folder,
load_in_4bit=True, fast_inference=True, max_lora_rank=r, gpu_memory_utilization=--unsloth-memory, max_seq_length=
prompt + completion caps): vLLM runs in that process on the weights quantised to NF4 by bitsandbytes, and the
training model is built on the same tensors; get_peft_model with the LoRA below and gradient checkpointing
"unsloth"; TRL's GRPOTrainer, which Unsloth's patch sets to use_vllm=True, vllm_mode="colocate" for such a model,
vLLM's sleep mode only under its standby (`--standby`: UNSLOTH_VLLM_STANDBY=1, which raises vLLM's share to ~0.88).
Ours: train.py with model.load_in_4bit=true model.learner_backend=unsloth (+experiment=gpu_shared_qwen0.5b's GPU
settings: CUDA IPC sync, bf16 compute), the vLLM actor on the learner's NF4 base dequantized (model.actor_base's
default), in a bench.colocate layout: `split` (0.5/0.5 GPU bundles, vLLM 30% of the memory) or `colocate` (taking
turns, vLLM 60%, asleep while the learner trains); --actor-memory sets vLLM's share.

The work (bench.e2e_trl.Work, stated once for both sides): --prompts reasoning-gym chain_sum prompts (the demo's
task and scorer) x --n completions of at most --max-tokens tokens, LoRA r16 alpha 32 on all 7 projections, KL 0.01
(k3, adapter-off reference), TRL loss_type "grpo" = our seq_mean_token_mean, AdamW at a constant lr 2e-4 (Unsloth's
side runs torch's fused AdamW, as ours, not its default adamw_8bit: a few milliseconds on LoRA's parameters either
way), micro-batches of 32 completions (TRL: per_device_train_batch_size 32, gradient accumulation over the rest, one
generation batch per optimizer step; ours pads 32 sequences, Unsloth's auto). Random weights give a near-uniform
next token, EOS about once in 32,000, so both sides generate (almost) every completion to the cap: the same decode
work each step, as a speed comparison wants (the table shows each side's mean completion length). The scorer gives
a random model 0; with the KL term both learners still run every sample's forward and backward.

Each run is a fresh process; `--repeats` alternate the sides. Step = the wall time between optimizer steps (ours:
time/step_s; Unsloth's: bench.e2e_trl.step_marks); steady = the median of steps 2..N pooled over the repeats, with
its min-max; steps/s and samples/s from it; start-up (the process's wall time less its steps) apart. Memory: the
GPU's used memory at its peak, nvidia-smi every 0.5 s while the side runs (what counts both sides alike: vLLM
reserves its share up front, in Unsloth's one process as in our actor), beside torch's own peak (Unsloth's process:
max_memory_allocated, vLLM's weights and KV cache included; ours: the learner's memory/learner_peak_gb) and vLLM's
KV cache in tokens. Rows go to --out/SHAPE-PxNxT/SIDE-K.json (K counts up: nothing is overwritten); the report reads
every row there, so sides may run in separate calls, and appends the comparison to bench/results.jsonl (claim
e2e-unsloth-7b or e2e-unsloth-0.5b) once Unsloth's side and one of ours are there.

Past 400 lines because it holds one tool a GPU session runs call by call: both sides' launchers (Unsloth's recipe in
its own process, our train.py runs), the device memory sampler, and the report over rows from separate calls.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from bench.colocate import LAYOUTS, kv_cache_tokens, machine_info, model_folder
from bench.common import REPO, append_result, show_spread, spread
from bench.e2e_trl import Work, logged, run_keys, run_train, side_result, step_marks, trl_task
from rl.run_files import read_metrics
from tests.helpers import repo_env

SIDES = ("unsloth", *LAYOUTS)
CLAIMS = {"qwen2.5-7b": "e2e-unsloth-7b", "qwen2.5-0.5b": "e2e-unsloth-0.5b"}
MICRO = 32  # completions per learner micro-batch on both sides (fewer when the step has fewer)
ROW = re.compile(r"^(?P<side>[a-z]+)-(?P<k>\d+)\.json$")


def work_of(args) -> Work:
    n = args.prompts * args.n
    return Work("cuda", prompts=args.prompts, G=args.n, max_new=args.max_tokens, micro=min(MICRO, n))


def unsloth_model_kwargs(work: Work, path: str, memory: float) -> dict:
    """FastLanguageModel.from_pretrained's keywords: the 4-bit base with vLLM in the process (fast_inference)."""
    return dict(
        model_name=str(path),
        max_seq_length=work.max_prompt + work.max_new,
        load_in_4bit=True,
        fast_inference=True,
        max_lora_rank=work.rank,
        gpu_memory_utilization=memory,
        random_state=0,
    )


def unsloth_lora_kwargs(work: Work) -> dict:
    """FastLanguageModel.get_peft_model's keywords: the work's LoRA, Unsloth's offloaded gradient checkpointing."""
    return {**work.lora(), "bias": "none", "use_gradient_checkpointing": "unsloth", "random_state": 0}


def unsloth_grpo_config(work: Work, steps: int, out: Path) -> dict:
    """GRPOConfig's keywords on Unsloth's side: the work, vLLM colocated in the process (Unsloth's patch sets both
    for a fast_inference model; stated here as well), ours' optimizer, one log line per step."""
    return dict(
        output_dir=str(out),
        max_steps=steps,
        **work.grpo_config(),
        use_vllm=True,
        vllm_mode="colocate",
        # Unsloth's default, stated: TRL's would run one more forward per step for an importance-sampling correction
        # toward vLLM's logprobs, which ours does not apply (its ratio is to the actor's logprobs, algorithm.tis_cap 0)
        vllm_importance_sampling_correction=False,
        optim="adamw_torch_fused",
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
    )


def ours_args(layout: str, work: Work, model: Path, out: Path, steps: int, actor_memory: float | None) -> list[str]:
    """train.py's overrides for our side in `layout` (a bench.colocate layout; `actor_memory` replaces its vLLM
    share)."""
    keys = list(LAYOUTS[layout])
    if actor_memory is not None:
        keys = [k for k in keys if not k.startswith("cluster.gpu_memory_utilization=")]
        keys.append(f"cluster.gpu_memory_utilization={actor_memory}")
    return [
        "+experiment=gpu_shared_qwen0.5b",
        f"model.path={model}",
        *run_keys(steps, out),
        *work.ours(),
        *keys,
        "model.load_in_4bit=true",
        "model.learner_backend=unsloth",
        "cluster.enforce_eager=false",
        # random weights: bench.colocate's margin over the probe's floor (docs/benchmarks.md#sync-probe-floor)
        "run.sync_probe_threshold=0.5",
    ]


def nvidia_smi_used_gib() -> float | None:
    """The used memory of the GPU this process would use (CUDA_VISIBLE_DEVICES' first, else 0), in GiB; None
    where nvidia-smi is missing or fails."""
    index = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or "0"
    cmd = ["nvidia-smi", "-i", index, "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = out.stdout.split()
    return float(values[0]) / 1024 if out.returncode == 0 and values else None


class DevicePeak:
    """The device's used memory at its highest while the `with` block runs, polled every `every` seconds on a
    thread (`query` returns GiB or None); `base` is the reading at entry. Both stay None without a reading."""

    def __init__(self, query=nvidia_smi_used_gib, every: float = 0.5):
        self.query, self.every = query, every
        self.base: float | None = None
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> DevicePeak:
        self.base = self.peak = self.query()
        if self.base is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.every):
            used = self.query()
            if used is not None:
                self.peak = max(self.peak or 0.0, used)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def run_ours(layout: str, work: Work, model: Path, run: Path, args) -> dict:
    """One train.py run in `layout`: bench.e2e_trl's row plus the learner's peak and the actor's KV cache."""
    row = run_train(layout, ours_args(layout, work, model, run, args.steps, args.actor_memory), run)
    metrics = read_metrics(run / "metrics.jsonl")
    peaks = [m["memory/learner_peak_gb"] for m in metrics if "memory/learner_peak_gb" in m]
    row["torch_peak_gib"] = round(max(peaks), 2) if peaks else None
    row["kv_cache_tokens"] = kv_cache_tokens(run / "logs" / "actor0.log")
    return row


def run_unsloth(work: Work, model: Path, run: Path, args) -> dict:
    """Unsloth's recipe in a fresh process (`--side-process`); its output goes to `run`.log."""
    result = run.with_suffix(".child.json")
    cmd = [sys.executable, "-m", "bench.e2e_unsloth", "--side-process", "--model", str(model), "--result", str(result)]
    cmd += ["--prompts", str(work.prompts), "--n", str(work.G), "--max-tokens", str(work.max_new)]
    cmd += ["--steps", str(args.steps), "--unsloth-memory", str(args.unsloth_memory), "--out", str(run)]
    cmd += ["--standby"] if args.standby else []
    log = run.with_suffix(".log")
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=REPO, env=repo_env(), stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise SystemExit(f"bench.e2e_unsloth: Unsloth's side failed ({proc.returncode}); all its output: {log}\n{tail}")
    row = json.loads(result.read_text())
    row["startup_s"] = wall - sum(row["step_s"])  # as ours': the process's wall time less its steps
    row["kv_cache_tokens"] = kv_cache_tokens(log)
    return row


def unsloth_side(args) -> None:
    """The process of Unsloth's side: Unsloth imported before anything else, then its recipe."""
    if args.standby:
        os.environ["UNSLOTH_VLLM_STANDBY"] = "1"  # read when unsloth is imported
    import unsloth  # noqa: F401  (first ML import of this process: it patches transformers, PEFT and TRL)

    unsloth_recipe(args)


def unsloth_recipe(args) -> None:
    """Unsloth's GRPO recipe for `--steps` steps; its row (the start-up here from the models' load to the first
    step) written to --result."""
    import torch
    from trl import GRPOConfig, GRPOTrainer
    from unsloth import FastLanguageModel

    t0 = time.perf_counter()
    work = work_of(args)
    model, tokenizer = FastLanguageModel.from_pretrained(**unsloth_model_kwargs(work, args.model, args.unsloth_memory))
    model = FastLanguageModel.get_peft_model(model, **unsloth_lora_kwargs(work))
    data, reward = trl_task()
    marks: list[float] = []
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=reward,
        args=GRPOConfig(**unsloth_grpo_config(work, args.steps, Path(args.out))),
        train_dataset=data,
        callbacks=[step_marks(marks)],
    )
    trainer.train()
    row = side_result(
        "unsloth",
        [b - a for a, b in zip(marks, marks[1:])],
        marks[0] - t0,
        reward_mean=logged(trainer, "reward"),
        completion_tokens_mean=logged(trainer, "completions/mean_length", 1),
        torch_peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
        standby=args.standby,
        trainer=type(trainer).__name__,  # UnslothGRPOTrainer: TRL's trainer as Unsloth's import rewrote it
        versions={p: installed(p) for p in ("unsloth", "unsloth_zoo", "trl", "vllm", "transformers", "torch")},
    )
    Path(args.result).write_text(json.dumps(row))


def installed(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def run_side(side: str, work: Work, model: Path, rows: Path, args) -> dict:
    """One run of `side` in a fresh process, the device's memory sampled meanwhile; its row is written to
    `rows`/SIDE-K.json with the next K no earlier run used (a cut run leaves its folder and log, but no row)."""
    used = (re.match(rf"{side}-(\d+)\b", p.name) for p in rows.iterdir())
    k = 1 + max((int(m[1]) for m in used if m), default=0)
    run = rows / f"{side}-{k}"
    with DevicePeak() as device:
        row = run_unsloth(work, model, run, args) if side == "unsloth" else run_ours(side, work, model, run, args)
    row |= {
        "side": side,
        "repeat": k,
        "work": asdict(work),
        "unsloth_memory": args.unsloth_memory if side == "unsloth" else None,
        "device_peak_gib": None if device.peak is None else round(device.peak, 2),
        "device_base_gib": None if device.base is None else round(device.base, 2),
        "machine": machine_info(),
    }
    (rows / f"{side}-{k}.json").write_text(json.dumps(row))
    return row


def rows_folder(out: str | Path, shape: str, work: Work) -> Path:
    return Path(out) / f"{shape}-{work.prompts}x{work.G}x{work.max_new}"


def side_stats(runs: list[dict], work: Work) -> dict:
    """One side's steady state over its runs: steps 2..N of every run pooled."""
    steady = [t for r in runs for t in (r["step_s"][1:] or r["step_s"])]
    s = spread(steady)

    def per_s(count: int) -> dict:  # `count` per step, at the median step and at the spread's ends
        return {"median": count / s["median"], "min": count / s["max"], "max": count / s["min"], "n": s["n"]}

    lengths = [x for r in runs for x in r.get("completion_tokens_mean", [])]
    peaks = [r["device_peak_gib"] for r in runs if r.get("device_peak_gib") is not None]
    torch_peaks = [r["torch_peak_gib"] for r in runs if r.get("torch_peak_gib") is not None]
    return {
        "runs": len(runs),
        "step_s": s,
        "steps_per_s": per_s(1),
        "samples_per_s": per_s(work.prompts * work.G),
        "startup_s": statistics.median(r["startup_s"] for r in runs),
        "device_peak_gib": max(peaks, default=None),
        "torch_peak_gib": max(torch_peaks, default=None),
        "kv_cache_tokens": runs[-1].get("kv_cache_tokens"),
        "completion_tokens_mean": round(statistics.mean(lengths), 1) if lengths else None,
    }


def report(rows: Path, shape: str, work: Work) -> dict:
    """The table of every row in `rows` and, where Unsloth's side and a layout of ours are both there, ours over
    Unsloth in steps/s with the range the two spreads allow; returns the summary."""
    found: dict[str, list[dict]] = {}
    for p in sorted(rows.iterdir(), key=lambda p: p.name) if rows.is_dir() else []:
        if m := ROW.match(p.name):
            found.setdefault(m["side"], []).append(json.loads(p.read_text()))
    stats = {side: side_stats(runs, work) for side, runs in found.items()}
    ratios = {}
    if "unsloth" in stats:
        theirs = stats["unsloth"]["step_s"]
        for layout in LAYOUTS:
            if layout in stats:
                ours = stats[layout]["step_s"]
                ratios[layout] = {
                    "ours_over_unsloth": round(theirs["median"] / ours["median"], 2),
                    "bounds": [round(theirs["min"] / ours["max"], 2), round(theirs["max"] / ours["min"], 2)],
                }
    print(f"{shape}, {work.prompts} prompts x {work.G} x {work.max_new} tokens, LoRA r{work.rank}, {rows}")
    print(
        "| side | steps/s | samples/s | step, median (min-max, n) | start-up | GPU peak (nvidia-smi) | torch peak |"
        " vLLM KV cache | completion tokens | ours / Unsloth steps/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for side, st in stats.items():
        print(table_row(side, st, found[side][0]["machine"].get("gpu", "no GPU"), ratios.get(side)))
    if not ratios:
        print(f"no ratio yet: {rows} needs rows of unsloth and of split or colocate (--sides)")
    return {"shape": shape, "work": asdict(work), "sides": stats, "ratios": ratios, "runs": found}


def table_row(side: str, st: dict, gpu: str, ratio: dict | None) -> str:
    def gib(x):
        return "-" if x is None else f"{x:.1f} GiB"

    kv = "-" if st["kv_cache_tokens"] is None else f"{st['kv_cache_tokens']:,}"
    vs = f"**{ratio['ours_over_unsloth']:.2f}x** ({ratio['bounds'][0]:.2f}-{ratio['bounds'][1]:.2f})" if ratio else "-"
    return (
        f"| {side} ({gpu}, {st['runs']} runs) | {show_spread(st['steps_per_s'], '', 3)} | "
        f"{show_spread(st['samples_per_s'], '', 1)} | {show_spread(st['step_s'], ' s', 2)} | {st['startup_s']:.0f} s | "
        f"{gib(st['device_peak_gib'])} | {gib(st['torch_peak_gib'])} | {kv} | {st['completion_tokens_mean']} | {vs} |"
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2.5-7b", help="a bench/shapes.py shape (random weights, 32k vocabulary)")
    ap.add_argument("--sides", default=",".join(SIDES), help=f"which of {', '.join(SIDES)} to run, in this order")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per run (the steady state: steps 2..N)")
    ap.add_argument("--repeats", type=int, default=1, help="fresh runs per side, alternating the sides")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="completions per prompt (the group size)")
    ap.add_argument("--max-tokens", type=int, default=512, help="completion cap in tokens")
    ap.add_argument("--unsloth-memory", type=float, default=0.5, help="Unsloth's gpu_memory_utilization for vLLM")
    ap.add_argument("--standby", action="store_true", help="Unsloth's standby (UNSLOTH_VLLM_STANDBY=1: vLLM sleeps)")
    ap.add_argument("--actor-memory", type=float, default=None, help="our vLLM share (default: the layout's)")
    ap.add_argument("--models", default="/tmp/shapes", help="where the shape's folder is built once")
    ap.add_argument("--out", default="/tmp/bench-e2e-unsloth", help="run folders and rows")
    ap.add_argument("--report-only", action="store_true", help="only the table of the rows in --out")
    ap.add_argument("--no-append", action="store_true", help="do not append to bench/results.jsonl")
    ap.add_argument("--side-process", action="store_true", help=argparse.SUPPRESS)  # Unsloth's side, in its process
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.side_process:
        return unsloth_side(args)
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        raise SystemExit(f"--sides: unknown {unknown} (choose from {', '.join(SIDES)})")
    try:
        work = work_of(args)
    except ValueError as e:
        raise SystemExit(f"--prompts/--n: {e}") from None
    rows = rows_folder(args.out, args.shape, work)
    if not args.report_only:
        rows.mkdir(parents=True, exist_ok=True)
        model = model_folder(args.shape, args.models)
        for _ in range(args.repeats):
            for side in sides:
                print(json.dumps(run_side(side, work, model, rows, args)), flush=True)
    summary = report(rows, args.shape, work)
    if summary["ratios"] and not args.no_append:
        first = summary["runs"]["unsloth"][0]  # where and when the comparison ran: its first run's machine
        append_result("e2e_unsloth", summary, info=first["machine"] or None, claim=CLAIMS.get(args.shape))


if __name__ == "__main__":
    main()
