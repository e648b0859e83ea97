"""PNG plots from metrics.jsonl: `python -m rl.tools.plot RUN_DIR [--out DIR]` (or `make plot RUN=...`).

RUN_DIR is a run directory (with metrics.jsonl) or a folder of runs (a sweep: every metrics.jsonl below it and the
runs its jobs wrote elsewhere with run.output_dir, one line per run in each figure). Writes into RUN_DIR/plots (or
--out): reward, eval accuracy, response length, clip fraction, KL, and the step time split into rollout / reward /
learn / sync / other. A figure whose metrics no run logged is skipped and named on stdout. For a sweep directory
(jobs in subfolders), the sweep summary (rl/tools/sweep.py: sweep_summary.csv/.md/.png, one row per job) is also
written into RUN_DIR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rl.run_files import read_metrics

# (file, title, y label, metric keys: one line per key and run)
LINE_FIGURES = [
    ("reward", "Reward (sampled, mean over the batch)", "reward", ["reward/mean"]),
    ("eval_accuracy", "Held-out accuracy (greedy)", "accuracy", ["eval/accuracy"]),
    ("response_length", "Response length (tokens, mean)", "tokens", ["response/length_mean"]),
    (
        "clip_fraction",
        "Clipped ratio fraction",
        "fraction of tokens",
        ["policy/clip_frac_low", "policy/clip_frac_high"],
    ),
    ("kl", "KL", "nats per token", ["policy/approx_kl", "policy/kl_ref", "policy/kl_ref_seq"]),
]
TIME_PARTS = [
    ("rollout", "time/rollout_s"),
    ("reward", "time/reward_s"),
    ("learn", "time/learn_s"),
    ("sync", "time/sync_s"),
]


def find_runs(root: Path) -> dict[str, list[dict]]:
    """label -> rows for every metrics.jsonl at or below root (label: the run's folder relative to root), and for
    each sweep job that wrote its run elsewhere (a sweep over run.output_dir: label, the job's folder name)."""
    root = Path(root)
    if (root / "metrics.jsonl").is_file():
        return {root.name: read_metrics(root / "metrics.jsonl")}
    runs = {str(f.parent.relative_to(root)): read_metrics(f) for f in sorted(root.rglob("metrics.jsonl"))}
    from rl.tools.sweep import find_jobs, run_dir_of

    for job in find_jobs(root):
        metrics = run_dir_of(job) / "metrics.jsonl"
        if metrics.is_file() and not metrics.resolve().is_relative_to(root.resolve()):
            runs[job.name] = read_metrics(metrics)
    return runs


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r[key])) for r in rows if isinstance(r.get(key), int | float)]
    return [s for s, _ in pts], [v for _, v in pts]


def plot_runs(runs: dict[str, list[dict]], out: Path) -> list[Path]:
    """Write the figures for `runs` into `out`; returns the PNG paths written."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, ylabel, keys in LINE_FIGURES:
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = 0
        for label, rows in runs.items():
            for key in keys:
                x, y = series(rows, key)
                if x:
                    tag = key if len(runs) == 1 else f"{label}: {key}"
                    ax.plot(x, y, marker="o" if len(x) < 30 else None, markersize=3, label=tag)
                    drawn += 1
        if drawn:
            ax.set(title=title, xlabel="step", ylabel=ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(out / f"{name}.png", dpi=110)
            written.append(out / f"{name}.png")
        else:
            print(f"skipped {name}.png: no run logged {', '.join(keys)}")
        plt.close(fig)
    path = plot_step_time(runs, out, plt)
    if path:
        written.append(path)
    return written


def plot_step_time(runs: dict[str, list[dict]], out: Path, plt) -> Path | None:
    """Stacked bars: per step for one run, the per-step mean of each run for a sweep. `other` is the rest of
    time/step_s (the sync probe, advantages, bookkeeping)."""
    bars: list[tuple[str, dict[str, float]]] = []
    for label, rows in runs.items():
        steps = [r for r in rows if "time/step_s" in r]
        parts_per_step = []
        for r in steps:
            parts = {name: float(r.get(key, 0.0)) for name, key in TIME_PARTS}
            parts["other"] = max(float(r["time/step_s"]) - sum(parts.values()), 0.0)
            parts_per_step.append((str(r["step"]), parts))
        if len(runs) == 1:
            bars = parts_per_step
        elif parts_per_step:
            names = parts_per_step[0][1].keys()
            bars.append((label, {n: sum(p[n] for _, p in parts_per_step) / len(parts_per_step) for n in names}))
    if not bars:
        print("skipped step_time.png: no run logged time/step_s")
        return None
    fig, ax = plt.subplots(figsize=(max(7, 0.25 * len(bars)), 4))
    bottom = [0.0] * len(bars)
    for name in [n for n, _ in TIME_PARTS] + ["other"]:
        heights = [p[name] for _, p in bars]
        ax.bar(range(len(bars)), heights, bottom=bottom, label="other (sync probe, ...)" if name == "other" else name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(len(bars)), [x for x, _ in bars], rotation=90 if len(runs) > 1 else 0, fontsize=7)
    single = len(runs) == 1
    ax.set(
        title="Step time by role" + ("" if single else " (mean per step)"),
        xlabel="step" if single else "run",
        ylabel="seconds",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "step_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.tools.plot", description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run directory (with metrics.jsonl) or a sweep directory")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: RUN/plots)")
    ns = parser.parse_args(argv)
    runs = find_runs(ns.run) if ns.run.is_dir() else {}
    if not runs:
        print(f"error: no metrics.jsonl at or below {ns.run}", file=sys.stderr)
        return 2
    written = plot_runs(runs, ns.out or ns.run / "plots")
    if not (ns.run / "metrics.jsonl").is_file():  # a folder of runs: also the one-row-per-job summary
        from rl.tools.sweep import find_jobs, write_summary

        if find_jobs(ns.run):
            written += write_summary(ns.run)
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
