"""Small pieces the benchmark scripts share: the model to run, demo-like prompts, a random adapter, machine facts,
and the one writer of bench/results.jsonl, the history every bench run appends to (docs/benchmarks.md quotes its
latest line per claim).

`python -m bench.common append-run NAME RUN_DIR [ARG...]` appends a train.py run's result (its summary.json and the
median step times) for the shell scripts of bench/gpu/."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rl.run_files import read_metrics

REPO = Path(__file__).resolve().parent.parent
RESULTS_ENV = "RLFT_BENCH_RESULTS"  # where results go instead of bench/results.jsonl (a test's tmp_path)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def add_model_args(ap) -> None:
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct", help="model.path (ignored with --shape)")
    ap.add_argument("--shape", default=None, help="random-init model of a named shape (bench/shapes.py) instead")
    ap.add_argument("--layers", type=int, default=None, help="with --shape: fewer layers than the real model")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add_threads_arg(ap)


def add_threads_arg(ap) -> None:
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads per process, the same on both sides (default: all cores). On a shared, loaded machine use "
        "1: with more threads than free cores, OpenMP's spinning barriers slow torch by 10-40x (seen here)",
    )


def set_threads(n: int | None) -> int:
    """Use n torch threads in this process (all cores when None); returns n."""
    import torch

    n = n or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def model_path(args) -> str:
    """A local model folder: the resolved --model, or a random --shape folder built once under the cache."""
    if args.shape:
        from bench.shapes import build_model_folder
        from rl.model_path import cache_dir

        name = args.shape + (f"-{args.layers}l" if args.layers else "")
        return str(build_model_folder(args.shape, cache_dir() / "bench" / name, layers=args.layers))
    from rl.model_path import resolve_model_path

    return resolve_model_path(args.model)


def vllm_memory_fraction(path: str, sequences: int, seq_len: int, lora_rank: int = 0, dtype: str = "bfloat16") -> float:
    """cluster.gpu_memory_utilization for a bench's CPU vLLM engine, derived from this machine rather than fixed:
    the share of the NUMA node it allocates on (what vLLM's CPU worker takes the fraction of) that holds what
    rl/preflight/memory.py estimates the engine uses before its KV cache, with 50% headroom, plus the KV cache of
    `sequences` x `seq_len` tokens (`lora_rank` > 0: a native LoRA slot too). Small on a shared machine, enough on
    any: the same arithmetic `plan=true` checks a run with."""
    from rl.preflight.machine import numa_node_memory
    from rl.preflight.memory import vllm_cpu_fraction, vllm_cpu_non_kv_bytes
    from rl.preflight.shapes import DTYPE_BYTES, load_shape

    shape, why = load_shape(path)
    if shape is None:
        raise SystemExit(f"cannot size the vLLM engine of {path}: {why}")
    b = DTYPE_BYTES.get(dtype, 2)
    engine = vllm_cpu_non_kv_bytes(shape.weight_bytes(b)) + shape.lora_params(lora_rank, LORA_TARGETS) * b
    kv = sequences * seq_len * shape.kv_bytes_per_token(b)
    return vllm_cpu_fraction(engine, kv, numa_node_memory().total, headroom=1.5)


def demo_prompts(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    """n chat-formatted prompts like the demo's (reasoning-gym chain_sum: two 1-digit terms), as token ids."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, op = rng.randrange(10), rng.randrange(10), rng.choice("+-")
        msg = f"State the final answer to the following arithmetic problem: {a} {op} {b} =\n"
        msg += "Give the final answer as a number at the end."
        enc = tokenizer.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True)
        out.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    return out


def learner_config(path: str, *overrides: str, rank: int = 16, dtype: str = "float32", seed: int = 0, threads=None):
    """The resolved config a run's learner takes for LoRA rank `rank` (alpha 2r) on all 7 projections, learner
    weights in `dtype`, no KL term, plus config overrides; `path` is taken as the resolved model path."""
    from rl.resolve import from_overrides

    keys = [
        f"model.lora_rank={rank}",
        f"model.lora_alpha={2 * rank}",
        f"model.learner_dtype={dtype}",
        f"run.seed={seed}",
    ]
    keys.append("algorithm.kl_coef=0")  # no reference forward unless the overrides ask for one
    keys.append(f"cluster.learner_threads={threads if threads else 'null'}")
    return from_overrides(path, *keys, *overrides)


def random_adapters(
    path: str,
    jobs: int = 1,
    rank: int = 16,
    *,
    dtype: str = "float32",
    seed: int = 0,
    threads: int | None = None,
    for_sync: bool = False,
) -> list:
    """`jobs` PEFT adapters (rl.types.Adapter) on all 7 projections, each with its own small random non-zero B
    (drawn from seed + its number: a trained-looking adapter, which costs to merge or apply what a real one does),
    from one learner; `for_sync`: in the precision the actors load them at (Learner.get_adapter)."""
    import torch

    from rl.app import learner_args
    from rl.learner import Learner

    learner = Learner(**learner_args(learner_config(path, rank=rank, dtype=dtype, seed=seed, threads=threads)))
    out = []
    for j in range(jobs):
        g = torch.Generator().manual_seed(seed + j)
        with torch.no_grad():
            for name, p in learner.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 1e-3)
        learner.version = 1
        out.append(learner.get_adapter(for_sync=for_sync))
    del learner
    return out


def git(*args: str) -> str:
    """A git command's output in the repository; empty where git or the repository's .git is missing."""
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - a missing git only loses the commit fields
        return ""


def cpu_model() -> str:
    """The host CPU's model name (Linux's /proc/cpuinfo; else what platform says): two lent machines with the same
    GPU may have different host CPUs, and a small model's engine and learner are bound by their host's Python."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """Where and when: host, cores and their model, load averages (the machine may be shared), date, git commit."""
    commit = git("rev-parse", "--short", "HEAD")
    info = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
    }
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        pass
    return info


def machine_label(info: dict) -> str:
    where = info.get("gpu") or f"{info['cpus']}-core CPU"
    return f"{where}, load {info['load_avg'][0]:.1f}, {info['date']}"


def results_path() -> Path:
    """The results file: $RLFT_BENCH_RESULTS when set, else bench/results.jsonl in the repository."""
    return Path(os.environ.get(RESULTS_ENV) or REPO / "bench" / "results.jsonl")


def append_result(
    bench: str, result: dict, argv: list[str] | None = None, *, command: str = "", info=None, claim: str | None = None
) -> dict:
    """Append one JSON line to `results_path()`: the bench, date, commit (and whether tracked files differed from it:
    the commit alone does not name what ran), machine, command, arguments and result; returns the line's object.
    `argv` defaults to this process's arguments, `command` to `python -m bench.<bench> <argv>`, `info` to machine()
    now (pass the one taken at the start of a long run to keep its date); `claim` names the docs/benchmarks.md
    anchor whose number the line backs."""
    argv = sys.argv[1:] if argv is None else argv
    info = info or machine()
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results.jsonl")
    record = {
        **({"claim": claim} if claim else {}),
        "bench": bench,
        "date": info["date"],
        "commit": info["commit"],
        "dirty": bool(changed),
        "machine": {k: info[k] for k in ("host", "cpus", "cpu", "gpu", "load_avg") if k in info},
        "command": command or shlex.join(["python", "-m", f"bench.{bench}", *argv]),
        "arguments": argv,
        "result": result,
    }
    path = results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")
    print(f"result appended to {path}", file=sys.stderr, flush=True)
    return record


STEP_PARTS = ("step", "rollout", "reward", "learn", "sync", "probe", "probe_samples", "probe_score", "prepare")


def step_part_medians(rows: list[dict]) -> tuple[dict[str, float], int]:
    """The median over a run's steps 2..N (step 1 compiles) of each part of a step its metrics rows log
    (`time/rollout_s` as "rollout", ...; STEP_PARTS), and how many steps that is."""
    steps = [r for r in rows if "time/step_s" in r and r.get("step", 0) >= 2]
    medians = {}
    for part in STEP_PARTS:
        values = [r[f"time/{part}_s"] for r in steps if f"time/{part}_s" in r]
        if values:
            medians[part] = round(statistics.median(values), 3)
    return medians, len(steps)


def run_result(run_dir: Path) -> dict:
    """A train.py run's result: its summary.json, and the median over steps 2..N of each part of a step
    (`median_time/rollout_s`, ...: step_part_medians)."""
    summary, metrics = Path(run_dir) / "summary.json", Path(run_dir) / "metrics.jsonl"
    result = json.loads(summary.read_text()) if summary.is_file() else {}
    medians, timed = step_part_medians(read_metrics(metrics) if metrics.is_file() else [])
    return result | {f"median_time/{part}_s": v for part, v in medians.items()} | {"steps_timed": timed}


def timed_generations(generate, prompts: list[list[int]], sampling, repeats: int, warmup: int | None = None):
    """One warm-up call (on the first `warmup` prompts; default all of them, so that the timed calls' batch sizes,
    kernels and allocations are warm: on the H200 a first full-size call ran at a third of the later ones), then
    `repeats` timed calls on all prompts. Returns the generated tokens/s and the token count of each timed call
    (every completion's tokens, EOS included)."""
    generate(prompts[:warmup] if warmup else prompts, sampling)
    rates, tokens = [], []
    for _ in range(repeats):
        rate, n = timed_generation(generate, prompts, sampling)
        rates.append(rate)
        tokens.append(n)
    return rates, tokens


def timed_generation(generate, prompts: list[list[int]], sampling) -> tuple[float, int]:
    """Tokens/s and generated tokens of one call."""
    t0 = time.perf_counter()
    out = generate(prompts, sampling)
    dt = time.perf_counter() - t0
    n = sum(len(c.token_ids) for o in out for c in o.completions)
    return n / dt, n


def profiled_step(step, rows: int) -> str:
    """One call of `step` under torch's profiler: its op table (self time, CUDA first where there is one), `rows`
    rows, and the self CPU and CUDA totals (a step whose CPU total exceeds its CUDA total waits on launches)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def dispatched_ops(call) -> int:
    """The torch ops one `call()` dispatches (aten ops under a TorchDispatchMode, views and metadata ops included):
    a GPU step bound by its host's work per op costs about that count times a host's time per op, whatever its
    rows, so the count, taken on a CPU, says what a change saves there without a GPU. On a CPU the backward runs in
    this thread and is counted; on CUDA it runs in autograd's device thread and is not."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    with Count() as counter:
        call()
    return counter.n


def python_profile(call, rows: int) -> str:
    """One `call()` under cProfile (this thread's Python, the calls it makes into C included): the top `rows` functions
    by their own time, then by cumulative time. A rollout engine that runs in this process (vLLM's in-process engine
    core) shows there how its time splits between scheduling, the model's forward and output handling."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.runcall(call)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(rows)
    stats.sort_stats("cumulative").print_stats(rows)
    return out.getvalue()


def peak_gib(step_metrics: list[dict]) -> float:
    """A side's peak GPU memory: the largest of our learner's per-step `memory/learner_peak_gb` (it resets CUDA's
    counter after every step, so the process-wide counter holds only what came after the last step), else the
    process's own peak (a raw library step); 0 without CUDA."""
    ours = [m["memory/learner_peak_gb"] for m in step_metrics if "memory/learner_peak_gb" in m]
    if ours:
        return max(ours)
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float]) -> dict:
    """Median, min and max of repeated measurements (one number alone has misled: repeats here vary 1.5-3x)."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def show_spread(s: dict, unit: str = "", digits: int = 0) -> str:
    """'1234 tok/s (1100-1300, n=3)' from `spread`."""
    f = f"{{:.{digits}f}}"
    lo, hi = f.format(s["min"]), f.format(s["max"])
    return f"{f.format(s['median'])}{unit} ({lo}-{hi}, n={s['n']})"


def run_side_process(module: str, side: str, argv: list[str], flag: str = "--sides") -> dict:
    """Run `python -m module <argv without flag> --side side` in a fresh process; its last JSON line."""
    forward, skip = [], False
    for a in argv:  # the command line without `flag` and its value
        if not skip and not a.startswith(flag):
            forward.append(a)
        skip = a == flag
    out = subprocess.run([sys.executable, "-m", module, *forward, "--side", side], capture_output=True, text=True)
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{module} --side {side} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def lora_deltas(config: dict, weights: dict) -> dict:
    """{hf_module_name: scale * B @ A} in fp32: the unfused merge, the reference that rl/rollout/vllm_ext.py's fused
    `merge_lora` is compared with (tests/unit/test_vllm_ext.py, bench/sync.py)."""
    from rl.rollout.vllm_ext import lora_factors

    factors, scale = lora_factors(config, weights)
    return {m: (b.float() @ a.float()) * scale for m, (b, a) in factors.items()}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="append a train.py run's result to the bench results file")
    sub = ap.add_subparsers(dest="what", required=True)
    run = sub.add_parser("append-run", help="NAME RUN_DIR [ARG...]: the run's summary and median step times")
    run.add_argument("name", help="the script that made the run, e.g. gpu/e2e.sh")
    run.add_argument("run_dir")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments, recorded as given")
    args = ap.parse_args()
    result = run_result(Path(args.run_dir))
    if not result.get("steps_timed") and len(result) == 1:
        raise SystemExit(f"{args.run_dir}: no summary.json or metrics.jsonl to record")
    append_result(args.name, result, args.args, command=shlex.join(["bash", f"bench/{args.name}", *args.args]))


if __name__ == "__main__":
    main()
