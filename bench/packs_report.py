"""bench.packs's report: the sides' wall time, samples/s and speed-up over the sequential side, each job's held-out
accuracy per side with the seed spread, and where a side's step goes. bench/packs.py runs the sides and reads them
back; this module keeps that one under 500 lines.
"""

from __future__ import annotations

from bench.common import STEP_PARTS, median, show_spread, spread

SEQUENTIAL = "sequential"


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
    lines += step_parts_table(by)
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


def step_parts_table(by: dict[str, list[dict]]) -> list[str]:
    """Where a step goes, per side (its runs by side): the median over its jobs of each job's median seconds of a
    step's part (bench.common.STEP_PARTS; "-" for a part no job logged, as in runs older than its metric); no table
    where no run recorded any."""
    rows = []
    for side, runs in by.items():
        jobs = [j["step_parts"] for r in runs for j in r["jobs"] if j.get("step_parts")]
        if jobs:
            cells = [median(v) if (v := [j[p] for j in jobs if p in j]) else None for p in STEP_PARTS]
            rows.append(f"| {side} | " + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |")
    if not rows:
        return []
    head = ["", "step parts, s (medians over steps 2-N and the jobs):", "| side | " + " | ".join(STEP_PARTS) + " |"]
    return head + ["|---|" + "---|" * len(STEP_PARTS)] + rows
