"""A sweep run as packs (hydra/launcher=pack) against the same sweep run job after job: wall time, samples/s, each
job's held-out accuracy side by side, and the speed-up of each pack size.

python -m bench.packs [--preset gpu|cpu] [--sweep KEY=A,B ...] [--packs 2,4,N] [--sides sequential,pack2,...]
    [--repeats 3] [--part K/M] [--report-only] [--restore SIDE] [--no-append] [--out DIR] [-- <train.py overrides]

Each side is one `python train.py -m <workload> <sweep>` in a fresh process: `sequential` with Hydra's basic launcher
(each job starts its own roles, trains, and stops them before the next job starts), `pack<k>` with hydra/launcher=pack
hydra.launcher.max_jobs=k (the sweep as packs of at most k jobs, one pack after another; rl/pack.py), `pack<k>-each` and
`pack<k>-grouped` the same with hydra.launcher.grouped_learner=false or true (the pack's learner steps its jobs one
after another, or in one grouped step even on a CPU, where auto steps them apart: what the grouped step gains), and any
of these with `-p<n>`: hydra.launcher.phases=n (`pack8-p1`: the 8 jobs in one phase, `pack8-p2` in two that step out of
phase; plain: the launcher's default, 1) and `-m<n>`: learner.pack_micro_batches=n (`pack8-m2`: two of each job's
micro-batches in one grouped forward; solo runs ignore the key, so the sequential side is the same). Its wall time is
the whole process's, start-ups included: what a user waits for. Samples/s is the samples every job trained (the sum
of their `train/samples`) over that wall time. The sides rotate between repeats, so a machine's drift falls on all of
them; the speed-up of a side is the sequential side's wall time over its own within a repeat, its median and range
over the repeats. The held-out accuracy before and after of each job comes from the job's summary.json, each side in a
column; the seed spread (the largest max-min of the sequential side's accuracy after over the seeds and repeats of
one setting) says how far a packed job may fall from its solo run by chance. Where a step goes, per side: the median
over its jobs of each job's median seconds of a step's parts over its steps 2-N (`time/rollout_s`, `time/learn_s`,
the sync probe's `time/probe_s` and its two halves, ...; metrics.jsonl).

Presets: `gpu` is the GPU demo (+experiment=gpu_smollm2_chain_sum, 8 jobs: 4 learning rates x 2 seeds), `cpu` the CPU
demo's SmolLM2 in a few short steps (4 jobs: 2 learning rates x 2 seeds). Each side's sweep folder, console and
result (`result.json`, with the device it ran on) are kept under --out; a side whose folder holds its result is read
back rather than run again (a bench cut off, or run one side per call, continues with the same command), one whose
folder holds no result is refused, and so is a result of another workload or of another device (timings compare on
one card kind only).

A side too long for one sitting (the GPU sweep job after job: 8 runs of the GPU demo) runs in parts: `--part K/M`
runs part K of M, the first swept key's values cut into M runs of equal length in their order, each with every value
of the other keys (lr=a,b,c,d x seed=0,1, M=2: lr=a,b x seed=0,1, then lr=c,d x seed=0,1), or, for M a multiple
of the first key's values, each value's jobs cut by the next key (M=8: one job a part), as one `train.py -m` of its
sub-sweep with the side's own launcher; its jobs keep the whole sweep's numbers and labels. A pack side is cut only
where each part holds whole packs that the launcher forms for the whole sweep (rl/pack.py split; pack4 of 8 jobs: 2
parts of one pack each): its packs are then the whole side's, run in separate processes. Once all parts of a side are
under --out, the side is their sum: wall time and samples added, jobs in the sweep's order. Each part starts a
process the whole side would not (its first job pays the one-time imports: each job's `job_s` and the part's
`startup_s`, from the process's start to its first job, show it) and may start on a machine without compilation
caches (its `caches`); the report shows all three. bench/gpu/packs.sh runs one part per call on the lent GPU machine.
A part's call appends nothing: `--report-only` prints the table of what --out holds and appends the result line once
every side of every repeat there is whole. `--restore SIDE` first writes SIDE's parts under --out from the newest
result line that holds it for the same workload (its folders lost with the machine that kept them), each marked
`restored` with that line's number in the report; the result line appended then holds them again. (Past 400 lines: one command runs the sides and their parts, reads them
back and reports them; what a part is and how parts add up lives in bench/packs_parts.py.)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, append_result, results_path, spread, step_part_medians
from bench.packs_parts import (
    FOLDER,
    Incomplete,
    Part,
    assemble,
    caches_here,
    check_device_here,
    check_whole_packs,
    cut_sweep,
    device_of,
    found_parts,
    label,
    one_device,
    parse_part,
    provenance,
    restore_side,
    where_run,
)
from bench.packs_report import SEQUENTIAL, report, seed_spread, speedups
from rl.run_files import read_metrics
from tests.helpers import repo_env

# pack<k>-each, pack<k>-grouped: a pack whose learner steps the jobs one after another, or together even on a CPU
# (hydra.launcher.grouped_learner false, true; plain pack<k> leaves it at auto: together on a GPU); a -p<n> suffix
# sets hydra.launcher.phases=n (plain: the launcher's default, 1), a -m<n> suffix learner.pack_micro_batches=n (each
# job's micro-batches in one grouped forward; a solo run ignores the key, so the sequential side stays the same)
LEARNER_SIDES = {"-each": "false", "-grouped": "true"}
PACK_SIDE = re.compile(r"pack(\d+)(-each|-grouped)?(?:-p(\d+))?(?:-m(\d+))?")


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
        wrong = [
            s
            for s in named
            if s != SEQUENTIAL
            and not ((m := PACK_SIDE.fullmatch(s)) and int(m[1]) and int(m[3] or 1) and int(m[4] or 1))
        ]
        if wrong:
            raise SystemExit(
                f"--sides {args.sides}: {', '.join(wrong)} is not sequential, pack<k>, pack<k>-each or pack<k>-grouped, "
                "with an optional -p<n> and -m<n> (k, n >= 1)"
            )
        return named
    sizes = args.packs.split(",")
    if not all(k == "N" or k.isdigit() for k in sizes):
        raise SystemExit(f"--packs {args.packs}: give whole numbers or N (the whole sweep), e.g. --packs 2,4,N")
    ks = sorted({n_jobs if k == "N" else int(k) for k in sizes})
    return [SEQUENTIAL, *(f"pack{k}" for k in ks if 1 < k <= n_jobs)]


def part_sweep(args: argparse.Namespace, listed: list[list[str]], part: Part) -> tuple[list[str], list[int]]:
    """Part k of m of the sweep (bench/packs_parts.py cut_sweep): its sweep overrides and the whole sweep's numbers of
    its jobs."""
    from rl.entry import sweep_jobs

    return cut_sweep(sweep(args), listed, part, lambda sub: sweep_jobs(str(REPO / "conf"), [*workload(args), *sub]))


def pack_size(side: str) -> int:
    m = PACK_SIDE.fullmatch(side)
    assert m is not None, side
    return int(m[1])


def train_args(side: str, sweep_dir: Path, args: argparse.Namespace, swept: list[str] | None = None) -> list[str]:
    """train.py's arguments for one side (or its part's sub-sweep `swept`): the sweep, and for a pack side the
    launcher and its bound."""
    launcher = [] if side == SEQUENTIAL else ["hydra/launcher=pack", f"hydra.launcher.max_jobs={pack_size(side)}"]
    if (m := PACK_SIDE.fullmatch(side)) and m[2]:
        launcher.append(f"hydra.launcher.grouped_learner={LEARNER_SIDES[m[2]]}")
    if m and m[3]:
        launcher.append(f"hydra.launcher.phases={m[3]}")
    if m and m[4]:
        launcher.append(f"learner.pack_micro_batches={m[4]}")
    return ["-m", *workload(args), *(swept or sweep(args)), *launcher, f"hydra.sweep.dir={sweep_dir}"]


def same_work(command: list[str]) -> list[str]:
    """A side's train.py arguments without its sweep folder, which differs between the machines that ran and read it."""
    return [a for a in command if not a.startswith("hydra.sweep.dir=")]


def read_job(job_dir: Path) -> dict:
    """One job's held-out accuracy before and after (summary.json), the samples it trained and the median seconds of
    each part of its steps 2-N (metrics.jsonl: `time/rollout_s` as "rollout", ...)."""
    summary = json.loads((job_dir / "summary.json").read_text())
    rows = read_metrics(job_dir / "metrics.jsonl")
    steps = [r for r in rows if "train/samples" in r]
    return {
        "steps": len(steps),
        "samples": sum(r["train/samples"] for r in steps),
        "accuracy_before": summary.get("eval/accuracy_before"),
        "accuracy_after": summary.get("eval/accuracy_after"),
        "step_parts": step_part_medians(rows)[0],
    }


def job_times(job_dir: Path, epoch: float) -> dict:
    """When a job started (Hydra writes its .hydra/ as it starts it), in seconds from its process's start at `epoch`,
    and how long it ran until its summary.json: a part's first job also pays the process's one-time imports."""
    start = (job_dir / ".hydra" / "overrides.yaml").stat().st_mtime
    return {"start_s": round(start - epoch, 1), "job_s": round((job_dir / "summary.json").stat().st_mtime - start, 1)}


def read_result(folder: Path, command: list[str]) -> dict:
    """A side's or part's result.json, refused where it is another workload's."""
    done = folder / "result.json"
    if not done.is_file():
        raise Incomplete(
            f"{folder}: a side or part that did not finish (no result.json); remove it or use another --out"
        )
    kept = json.loads(done.read_text())
    if same_work(kept["command"]) != same_work(command):
        raise SystemExit(
            f"{done}: a result of another workload (its command: {kept['command']}); give the same --preset, "
            "--sweep and overrides, or use another --out"
        )
    return kept


def run_part(
    side: str, repeat: int, part: Part, out: Path, args: argparse.Namespace, listed: list[list[str]], names: list[str]
) -> dict:
    """One part of a side (part 1/1: the whole side) in a fresh train.py process, or its result from an earlier call
    with the same --out."""
    folder = out / part.folder(side, repeat)
    swept, numbers = part_sweep(args, listed, part)
    cmd = [sys.executable, str(REPO / "train.py"), *train_args(side, folder / "sweep", args, swept)]
    if folder.exists():
        try:
            return read_result(folder, cmd[2:])
        except Incomplete as e:
            raise SystemExit(str(e)) from None
    if part.m > 1 and (out / Part().folder(side, repeat)).exists():
        raise SystemExit(
            f"{out / Part().folder(side, repeat)}: {side} repeat {repeat} is there whole; parts of it are not run"
        )
    if part.m > 1 and side != SEQUENTIAL:
        check_whole_packs(listed, side, pack_size(side), numbers)
    folder.mkdir(parents=True)
    caches, info = caches_here(), where_run()
    # shown at the start too: a part cut by its call's limit leaves no result.json to read it from
    print(f"{side} part {part} (repeat {repeat}): machine speed {json.dumps(info['speed'])}", flush=True)
    epoch, t0 = time.time(), time.perf_counter()
    with (folder / "console.log").open("w") as console:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=console, stderr=subprocess.STDOUT, env=repo_env())
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # train.py has the same SIGINT (the terminal's or timeout's): it stops its roles
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise SystemExit(
                f"{side} part {part} (repeat {repeat}) cut by SIGINT; {folder} keeps its console.log"
            ) from None
    wall_s = time.perf_counter() - t0
    if code != 0:
        tail = (folder / "console.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"{side} part {part} (repeat {repeat}) failed, exit {code} ({folder}):\n{tail}")
    sweep_dir = folder / "sweep"
    per_job = [
        {"job": n, "label": names[n], **read_job(sweep_dir / str(i)), **job_times(sweep_dir / str(i), epoch)}
        for i, n in enumerate(numbers)
    ]
    samples = sum(j["samples"] for j in per_job)
    result = {
        "bench": "packs",
        "side": side,
        "repeat": repeat,
        "part": str(part),
        "wall_s": round(wall_s, 1),
        "startup_s": min(j["start_s"] for j in per_job),
        "samples": samples,
        "samples_per_s": round(samples / wall_s, 3),
        "jobs": per_job,
        "device": device_of(info),
        "caches": caches,
        "machine": info,
        "command": cmd[2:],
    }
    (folder / "result.json").write_text(json.dumps(result))
    return result


def side_result(
    side: str, repeat: int, out: Path, args: argparse.Namespace, listed: list[list[str]], names: list[str]
) -> dict | None:
    """A side's result from its folders under --out: the whole side's, or the sum of its parts' once all are there
    (Incomplete where one is missing or did not finish); None where nothing of it is there."""
    whole, found = out / Part().folder(side, repeat), found_parts(out, side, repeat)
    if whole.exists() and found:
        raise SystemExit(f"{out}: {side} repeat {repeat} is there whole and in parts; keep one of them")
    if whole.exists():
        return read_result(whole, [*train_args(side, whole / "sweep", args)])
    if not found:
        return None
    m = next(iter(found)).m  # found_parts refuses parts of two splits
    missing = [str(Part(k, m)) for k in range(1, m + 1) if Part(k, m) not in found]
    if missing:
        raise Incomplete(
            f"{side} repeat {repeat}: part {', '.join(missing)} missing under {out} (run it: --part {missing[0]})"
        )
    parts = []
    for k in range(1, m + 1):
        folder, swept = found[Part(k, m)], part_sweep(args, listed, Part(k, m))[0]
        parts.append(read_result(folder, train_args(side, folder / "sweep", args, swept)))
    return assemble(parts, len(names))


def collect(
    order: list[str], repeats: list[int], out: Path, args: argparse.Namespace, listed: list[list[str]], names: list[str]
) -> tuple[list[dict], list[str]]:
    """Every side of `order` in every repeat that --out holds whole; and one line per side not whole yet."""
    results, gaps = [], []
    for repeat in repeats:
        for side in order:
            try:
                result = side_result(side, repeat, out, args, listed, names)
            except Incomplete as e:
                gaps.append(str(e))
                continue
            if result is None:
                gaps.append(f"{side} repeat {repeat}: not run")
            else:
                results.append(result)
    if results:
        one_device([(label(r), r.get("device")) for r in results])
    return results, gaps


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="the workload (default: gpu with CUDA)")
    ap.add_argument(
        "--sweep", action="append", default=None, help="a swept key, KEY=A,B (repeat it; replaces the preset's)"
    )
    ap.add_argument("--packs", default="2,4,N", help="pack sizes (hydra.launcher.max_jobs); N: the whole sweep")
    ap.add_argument("--sides", default=None, help="the sides to run, e.g. sequential,pack8 (default: from --packs)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--part", default="1/1", help="K/M: run part K of M of each side (the first swept key's values cut)"
    )
    ap.add_argument("--report-only", action="store_true", help="run nothing: the table of the sides --out holds")
    ap.add_argument(
        "--restore",
        default=None,
        metavar="SIDE",
        help="first write SIDE's parts under --out from its newest result line",
    )
    ap.add_argument("--no-append", action="store_true", help="do not append the result line to bench/results.jsonl")
    ap.add_argument("--out", default=None, help="folder for the sides (default: a temporary one)")
    ap.add_argument("overrides", nargs="*", help="train.py overrides after --, added to the preset's workload")
    return ap


def restore(args: argparse.Namespace, out: Path, listed: list[list[str]]) -> None:
    """--restore SIDE (bench/packs_parts.py restore_side): the side's parts under --out from the newest result line
    that holds it for this workload (the preset's and the command line's overrides and sweep)."""
    here = (workload(args), sweep(args))

    def same(record: dict) -> bool:
        try:
            kept = parser().parse_args(record.get("arguments", []))
        except SystemExit:
            return False
        kept.preset = kept.preset or ("cpu" if record.get("result", {}).get("device") == "cpu" else "gpu")
        return (workload(kept), sweep(kept)) == here

    def command(side: str, part: Part, folder: Path) -> list[str]:
        return train_args(side, folder / "sweep", args, part_sweep(args, listed, part)[0])

    restore_side(results_path(), args.restore, out, same, command)


def run_sides(args: argparse.Namespace, order: list[str], out: Path, listed: list[list[str]], names: list[str]) -> None:
    """Each side (or its part --part) of each repeat, the sides rotating between repeats; a side already whole under
    --out, in one folder or in parts, is read back."""
    part = parse_part(args.part)
    if out.is_dir():
        check_device_here(out, device_of(where_run()))
    for repeat in range(args.repeats):
        for side in order[repeat % len(order) :] + order[: repeat % len(order)]:
            try:
                result = side_result(side, repeat, out, args, listed, names) if part.m == 1 else None
            except Incomplete as e:
                raise SystemExit(str(e)) from None
            result = result or run_part(side, repeat, part, out, args, listed, names)
            print(json.dumps({k: v for k, v in result.items() if k not in ("command", "machine", "parts")}), flush=True)


def main() -> None:
    args = parser().parse_args()
    args.preset = args.preset or default_preset()
    listed = jobs(args)
    names = labels(args, listed)
    order = sides(args, len(listed))
    if args.report_only and not args.restore and not (args.out and Path(args.out).is_dir()):
        raise SystemExit(f"--report-only: give --out, the folder that holds the sides (now {args.out})")
    if args.restore and not args.out:
        raise SystemExit("--restore: give --out, the folder to write the side's parts in")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-packs-")).resolve()
    if args.restore:
        restore(args, out, listed)
    if args.report_only:
        repeats = sorted({int(m["repeat"]) for f in out.iterdir() if (m := FOLDER.fullmatch(f.name))})
    else:
        print(f"{len(listed)} jobs ({', '.join(sweep(args))}); sides {', '.join(order)}; in {out}", flush=True)
        run_sides(args, order, out, listed, names)
        repeats = list(range(args.repeats))
    results, gaps = collect(order, repeats, out, args, listed, names)
    if not results:
        raise SystemExit(f"{out}: no side is whole there yet ({'; '.join(gaps) or 'no side folders'})")
    print(report(results, order, names))
    print(provenance(results))
    for gap in gaps:
        print(f"not whole yet: {gap}")
    if gaps or args.no_append or parse_part(args.part).m > 1:  # a part's call: the sides' report appends the line
        print("result line not appended" + (" (not every side is whole)" if gaps else ""), file=sys.stderr)
        return
    done = [s for s in order if any(r["side"] == s for r in results)]
    summary = {
        s: {
            "wall_s": spread([r["wall_s"] for r in results if r["side"] == s]),
            "samples_per_s": spread([r["samples_per_s"] for r in results if r["side"] == s]),
            **({"speedup": spread(speedups(results, s))} if s != SEQUENTIAL and speedups(results, s) else {}),
        }
        for s in done
    }
    spread_seq = seed_spread([r for r in results if r["side"] == SEQUENTIAL])
    info = max((r["machine"] for r in results if "machine" in r), key=lambda i: i["date"], default=None)
    record = {"device": results[0].get("device"), "sides": summary, "seed_spread": spread_seq, "runs": results}
    append_result("packs", record, info=info or where_run(), claim="sweep-packs")


if __name__ == "__main__":
    main()
