"""A sweep run as packs (hydra/launcher=pack) against the same sweep run job after job: wall time, samples/s, each
job's held-out accuracy side by side, and the speed-up of each pack size.

python -m bench.packs [--preset gpu|cpu] [--sweep KEY=A,B ...] [--packs 2,4,N] [--sides sequential,pack2,...]
    [--repeats 3] [--out DIR] [-- <train.py overrides: added to the preset's workload>]

Each side is one `python train.py -m <workload> <sweep>` in a fresh process: `sequential` with Hydra's basic launcher
(each job starts its own roles, trains, and stops them before the next job starts), `pack<k>` with hydra/launcher=pack
hydra.launcher.max_jobs=k (the sweep as packs of at most k jobs, one pack after another; rl/pack.py). Its wall time is
the whole process's, start-ups included: what a user waits for. Samples/s is the samples every job trained (the sum
of their `train/samples`) over that wall time. The sides rotate between repeats, so a machine's drift falls on all of
them; the speed-up of a side is the sequential side's wall time over its own within a repeat, its median and range
over the repeats. The held-out accuracy before and after of each job comes from the job's summary.json, each side in a
column; the seed spread (the largest max-min of the sequential side's accuracy after over the seeds and repeats of
one setting) says how far a packed job may fall from its solo run by chance.

Presets: `gpu` is the GPU demo (+experiment=gpu_smollm2_chain_sum, 8 jobs: 4 learning rates x 2 seeds), `cpu` the CPU
demo's SmolLM2 in a few short steps (4 jobs: 2 learning rates x 2 seeds). Each side's sweep folder, console and
result (`result.json`) are kept under --out; a side whose folder holds its result is read back rather than run again
(a bench cut off, or run one side per call, continues with the same command), one whose folder holds no result is
refused.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, append_result, machine, median, show_spread, spread
from tests.helpers import repo_env

SEQUENTIAL = "sequential"


@dataclass(frozen=True)
class Preset:
    workload: tuple[str, ...]  # train.py overrides every job shares
    sweep: tuple[str, ...]  # the swept keys, `key=a,b,...`


PRESETS = {
    "gpu": Preset(
        ("+experiment=gpu_smollm2_chain_sum", "checkpoint.interval=0"),
        ("algorithm.lr=5e-5,1e-4,2e-4,4e-4", "run.seed=0,1"),
    ),
    "cpu": Preset(
        ("run.steps=4", "run.prompts_per_step=4", "algorithm.group_size=4", "eval.size=16", "checkpoint.interval=0"),
        ("algorithm.lr=2e-4,1e-3", "run.seed=0,1"),
    ),
}


def default_preset() -> str:
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def workload(args: argparse.Namespace) -> list[str]:
    """Every job's shared overrides: the preset's, then the command line's (a key given twice keeps its last value)."""
    return [*PRESETS[args.preset].workload, *args.overrides]


def sweep(args: argparse.Namespace) -> list[str]:
    return list(args.sweep or PRESETS[args.preset].sweep)


def jobs(args: argparse.Namespace) -> list[list[str]]:
    """Each job's overrides in the sweep's order (Hydra's basic sweeper, rl/entry.py sweep_jobs)."""
    from rl.entry import sweep_jobs

    listed = sweep_jobs(str(REPO / "conf"), [*workload(args), *sweep(args)])
    if not listed:
        raise SystemExit(f"--sweep {' '.join(sweep(args))}: lists no jobs (a comma list per key, e.g. run.seed=0,1)")
    return listed


def labels(args: argparse.Namespace, listed: list[list[str]]) -> list[str]:
    """Each job's swept values (`algorithm.lr=1e-4 run.seed=1`)."""
    keys = [s.split("=", 1)[0] for s in sweep(args)]
    return [" ".join(o for o in job if o.split("=", 1)[0] in keys) for job in listed]


def sides(args: argparse.Namespace, n_jobs: int) -> list[str]:
    """`sequential` and `pack<k>` for each pack size of --packs (N: the whole sweep), the sizes above N dropped; or
    --sides as given."""
    if args.sides:
        named = args.sides.split(",")
        wrong = [s for s in named if s != SEQUENTIAL and not (s.startswith("pack") and s[4:].isdigit() and int(s[4:]))]
        if wrong:
            raise SystemExit(f"--sides {args.sides}: {', '.join(wrong)} is not sequential or pack<k> (k >= 1)")
        return named
    sizes = args.packs.split(",")
    if not all(k == "N" or k.isdigit() for k in sizes):
        raise SystemExit(f"--packs {args.packs}: give whole numbers or N (the whole sweep), e.g. --packs 2,4,N")
    ks = sorted({n_jobs if k == "N" else int(k) for k in sizes})
    return [SEQUENTIAL, *(f"pack{k}" for k in ks if 1 < k <= n_jobs)]


def train_args(side: str, sweep_dir: Path, args: argparse.Namespace) -> list[str]:
    """train.py's arguments for one side: the sweep, and for a pack side the launcher and its bound."""
    launcher = [] if side == SEQUENTIAL else ["hydra/launcher=pack", f"hydra.launcher.max_jobs={side[len('pack') :]}"]
    return ["-m", *workload(args), *sweep(args), *launcher, f"hydra.sweep.dir={sweep_dir}"]


def read_job(job_dir: Path) -> dict:
    """One job's held-out accuracy before and after (summary.json) and the samples it trained (metrics.jsonl)."""
    summary = json.loads((job_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (job_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "train/samples" in r]
    return {
        "steps": len(steps),
        "samples": sum(r["train/samples"] for r in steps),
        "accuracy_before": summary.get("eval/accuracy_before"),
        "accuracy_after": summary.get("eval/accuracy_after"),
    }


def run_side(side: str, repeat: int, out: Path, args: argparse.Namespace, names: list[str]) -> dict:
    """One side in a fresh train.py process, or its result from an earlier call with the same --out."""
    folder = out / f"{side}-{repeat}"
    done = folder / "result.json"
    cmd = [sys.executable, str(REPO / "train.py"), *train_args(side, folder / "sweep", args)]
    if done.is_file():
        kept = json.loads(done.read_text())
        if kept["command"] != cmd[2:]:
            raise SystemExit(
                f"{done}: a result of another workload (its command: {kept['command']}); use another --out"
            )
        return kept
    if folder.exists():
        raise SystemExit(f"{folder}: a side that did not finish (no result.json); remove it or use another --out")
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=repo_env())
    wall_s = time.perf_counter() - t0
    (folder / "console.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{side} (repeat {repeat}) failed, exit {proc.returncode} ({folder}):\n{proc.stderr[-3000:]}")
    per_job = [{"job": i, "label": name, **read_job(folder / "sweep" / str(i))} for i, name in enumerate(names)]
    samples = sum(j["samples"] for j in per_job)
    result = {
        "bench": "packs",
        "side": side,
        "repeat": repeat,
        "wall_s": round(wall_s, 1),
        "samples": samples,
        "samples_per_s": round(samples / wall_s, 3),
        "jobs": per_job,
        "command": cmd[2:],
    }
    done.write_text(json.dumps(result))
    return result


def speedups(results: list[dict], side: str) -> list[float]:
    """The sequential side's wall time over `side`'s, per repeat that ran both."""
    by = {(r["side"], r["repeat"]): r["wall_s"] for r in results}
    return [by[SEQUENTIAL, k] / by[side, k] for s, k in by if s == side and (SEQUENTIAL, k) in by]


def seed_spread(runs: list[dict]) -> float | None:
    """The largest max-min of held-out accuracy after over the seeds of one setting (jobs whose labels differ only
    in run.seed) and the repeats of `runs`: how far two runs of one setting fall apart by chance."""
    by_setting: dict[str, list[float]] = {}
    for run in runs:
        for j in run["jobs"]:
            setting = " ".join(o for o in j["label"].split() if not o.startswith("run.seed="))
            if j["accuracy_after"] is not None:
                by_setting.setdefault(setting, []).append(j["accuracy_after"])
    gaps = [max(v) - min(v) for v in by_setting.values() if len(v) > 1]
    return max(gaps) if gaps else None


def accuracy(runs: list[dict], job: int, key: str) -> float | None:
    values = [r["jobs"][job][key] for r in runs if r["jobs"][job][key] is not None]
    return median(values) if values else None


def report(results: list[dict], order: list[str], names: list[str]) -> str:
    """The sides' wall time, samples/s and speed-up; each job's held-out accuracy per side (median over the repeats);
    the seed spread and each pack side's largest distance from the sequential side."""
    by = {s: [r for r in results if r["side"] == s] for s in order if any(r["side"] == s for r in results)}
    lines = ["| side | wall s | samples/s | speed-up vs sequential |", "|---|---|---|---|"]
    for side, runs in by.items():
        ups = speedups(results, side)
        up = show_spread(spread(ups), "x", 2) if ups and side != SEQUENTIAL else "-"
        wall = show_spread(spread([r["wall_s"] for r in runs]), digits=1)
        lines.append(
            f"| {side} | {wall} | {show_spread(spread([r['samples_per_s'] for r in runs]), digits=3)} | {up} |"
        )

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    first = next(iter(by.values()))
    lines += ["", "| job | held-out before | " + " | ".join(f"after, {s}" for s in by) + " |"]
    lines.append("|---|---|" + "---|" * len(by))
    for i, name in enumerate(names):
        after = " | ".join(cell(accuracy(runs, i, "accuracy_after")) for runs in by.values())
        lines.append(f"| #{i} {name} | {cell(accuracy(first, i, 'accuracy_before'))} | {after} |")
    if SEQUENTIAL in by:
        base = by[SEQUENTIAL]
        lines.append("")
        lines.append(f"seed spread (sequential, held-out after): {cell(seed_spread(base))}")
        for side, runs in by.items():
            gaps = [
                abs(a - b)
                for i in range(len(names))
                if (a := accuracy(runs, i, "accuracy_after")) is not None
                and (b := accuracy(base, i, "accuracy_after")) is not None
            ]
            if side != SEQUENTIAL and gaps:
                lines.append(f"{side}: largest |after - sequential's after| over the jobs: {max(gaps):.3f}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="the workload (default: gpu with CUDA)")
    ap.add_argument(
        "--sweep", action="append", default=None, help="a swept key, KEY=A,B (repeat it; replaces the preset's)"
    )
    ap.add_argument("--packs", default="2,4,N", help="pack sizes (hydra.launcher.max_jobs); N: the whole sweep")
    ap.add_argument("--sides", default=None, help="the sides to run, e.g. sequential,pack8 (default: from --packs)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="folder for the sides (default: a temporary one)")
    ap.add_argument("overrides", nargs="*", help="train.py overrides after --, added to the preset's workload")
    return ap


def main() -> None:
    args = parser().parse_args()
    args.preset = args.preset or default_preset()
    info = machine()
    listed = jobs(args)
    names = labels(args, listed)
    order = sides(args, len(listed))
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-packs-")).resolve()
    print(f"{len(listed)} jobs ({', '.join(sweep(args))}); sides {', '.join(order)}; in {out}", flush=True)
    results = []
    for repeat in range(args.repeats):
        for side in order[repeat % len(order) :] + order[: repeat % len(order)]:
            results.append(run_side(side, repeat, out, args, names))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "command"}), flush=True)
    print(report(results, order, names))
    summary = {
        s: {
            "wall_s": spread([r["wall_s"] for r in results if r["side"] == s]),
            "samples_per_s": spread([r["samples_per_s"] for r in results if r["side"] == s]),
            **({"speedup": spread(speedups(results, s))} if s != SEQUENTIAL and speedups(results, s) else {}),
        }
        for s in order
    }
    spread_seq = seed_spread([r for r in results if r["side"] == SEQUENTIAL])
    append_result(
        "packs", {"sides": summary, "seed_spread": spread_seq, "runs": results}, info=info, claim="sweep-packs"
    )


if __name__ == "__main__":
    main()
