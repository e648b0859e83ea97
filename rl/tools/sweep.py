"""Sweep summary: one row per job of a `python train.py -m ...` sweep, as CSV, Markdown and a PNG of bar charts.

Written into the sweep directory by a Hydra callback when the multirun ends (`SweepSummary`, configured under
`hydra.callbacks` in conf/train.yaml), and by `make plot RUN=<sweep dir>` for an existing sweep. Each job gives
its row: `.hydra/overrides.yaml` (what the job changed) and, from its run directory (the job
directory, or the run.output_dir its config gave), `metrics.jsonl` (per-step throughput and times) and
`summary.json` (final eval accuracy; absent when the job did not finish).

Idle fraction per role: the share of step time a role waits. Runs log `perf/actor_idle_frac` and
`perf/learner_idle_frac` when they measure it (asynchronous rollouts overlap the roles); otherwise it comes from
the synchronous step's time split, where actors work during `time/rollout_s`, learners during `time/learn_s`,
both during `time/sync_s` (the adapter moves from learner to actors), and the rest of `time/step_s` (rewards,
sync probe, bookkeeping) is idle for both: idle = 1 - sum(busy) / sum(step).

This module is imported when Hydra starts (the callback), so it stays light: matplotlib only inside the PNG writer.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from rl import run_files
from rl.atomic import replace_when_done

FILES = ("sweep_summary.csv", "sweep_summary.md", "sweep_summary.png")

# (column, header in the Markdown table, format)
COLUMNS = [
    ("job", "job", "{}"),
    ("overrides", "overrides", "{}"),
    ("status", "status", "{}"),
    ("steps", "steps", "{:d}"),
    ("rollout_tokens_per_s", "rollout tok/s", "{:.1f}"),
    ("learner_tokens_per_s", "learner tok/s", "{:.1f}"),
    ("step_s", "step s", "{:.2f}"),
    ("actor_idle_frac", "actor idle", "{:.2f}"),
    ("learner_idle_frac", "learner idle", "{:.2f}"),
    ("sync_s", "sync s", "{:.3f}"),
    ("final_reward", "final reward", "{:.3f}"),
    ("eval_accuracy_before", "eval acc before", "{:.3f}"),
    ("eval_accuracy", "eval acc", "{:.3f}"),
]
# bar charts of the PNG: (column, title)
BARS = [
    ("rollout_tokens_per_s", "Rollout tokens/s (mean per step)"),
    ("learner_tokens_per_s", "Learner tokens/s (mean per step)"),
    ("step_s", "Step time (s, mean)"),
    ("idle", "Idle fraction per role"),
    ("final_reward", "Final reward (last step, sampled)"),
    ("eval_accuracy", "Held-out accuracy after training"),
]


def read_metrics(path: Path) -> list[dict]:
    return run_files.read_metrics(path) if path.is_file() else []  # a job that never logged a step has no file


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _col(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]


def idle_fractions(steps: list[dict]) -> tuple[float | None, float | None]:
    """(actor, learner) idle fraction over the training steps: the logged perf/*_idle_frac when present, else
    from the synchronous time split (see the module docstring)."""
    actor, learner = _mean(_col(steps, "perf/actor_idle_frac")), _mean(_col(steps, "perf/learner_idle_frac"))
    timed = [r for r in steps if isinstance(r.get("time/step_s"), int | float) and r["time/step_s"] > 0]
    total = sum(float(r["time/step_s"]) for r in timed)
    if total > 0:
        sync = sum(_col(timed, "time/sync_s"))
        if actor is None:
            actor = min(max(1.0 - (sum(_col(timed, "time/rollout_s")) + sync) / total, 0.0), 1.0)
        if learner is None:
            learner = min(max(1.0 - (sum(_col(timed, "time/learn_s")) + sync) / total, 0.0), 1.0)
    return actor, learner


def read_overrides(job_dir: Path) -> list[str]:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.load(path)]


def run_dir_of(job_dir: Path) -> Path:
    """Where a job wrote its run: the run.output_dir its config gave (a sweep over run.output_dir; relative to the
    directory the sweep was started from), else the job directory itself."""
    from omegaconf import OmegaConf

    config, hydra = job_dir / ".hydra" / "config.yaml", job_dir / ".hydra" / "hydra.yaml"
    out = config.is_file() and OmegaConf.select(
        OmegaConf.load(config), "run.output_dir", throw_on_resolution_failure=False
    )
    if not out:
        return job_dir
    cwd = hydra.is_file() and OmegaConf.select(OmegaConf.load(hydra), "hydra.runtime.cwd")
    return Path(cwd or ".") / out  # an absolute run.output_dir stays as it is


def job_row(job_dir: Path) -> dict[str, Any]:
    """One sweep-summary row from a job's run directory (missing values are None)."""
    run_dir = run_dir_of(job_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in rows if "train/loss" in r or "time/step_s" in r]
    try:
        summary = run_files.read_summary(run_dir / "summary.json") or {}
    except run_files.DamagedFile:  # a row all the same, its job counted as not finished
        summary = {}
    before = [r["eval/accuracy"] for r in rows if r.get("step") == 0 and "eval/accuracy" in r]
    actor_idle, learner_idle = idle_fractions(steps)
    rewards = _col(steps, "reward/mean")
    return {
        "job": job_dir.name,
        "overrides": read_overrides(job_dir),
        "status": "done" if summary else ("incomplete" if steps else "no steps"),
        "steps": len(steps),
        "rollout_tokens_per_s": _mean(_col(steps, "perf/rollout_tokens_per_s")),
        "learner_tokens_per_s": _mean(_col(steps, "perf/learner_tokens_per_s")),
        "step_s": _mean(_col(steps, "time/step_s")),
        "actor_idle_frac": actor_idle,
        "learner_idle_frac": learner_idle,
        "sync_s": _mean(_col(steps, "time/sync_s")),
        "final_reward": summary.get("reward/last", rewards[-1] if rewards else None),
        "eval_accuracy_before": summary.get("eval/accuracy_before", before[0] if before else None),
        "eval_accuracy": summary.get("eval/accuracy_after"),  # only a finished job evaluates after training
    }


def find_jobs(sweep_dir: Path) -> list[Path]:
    """The job directories of a sweep: its subfolders holding a metrics.jsonl or a .hydra folder, in job order."""
    jobs = [
        d
        for d in Path(sweep_dir).iterdir()
        if d.is_dir() and ((d / "metrics.jsonl").is_file() or (d / ".hydra" / "overrides.yaml").is_file())
    ]
    return sorted(jobs, key=lambda d: (0, int(d.name), "") if d.name.isdigit() else (1, 0, d.name))


def build_summary(sweep_dir: Path) -> list[dict[str, Any]]:
    """Rows for every job; `overrides` becomes the overrides that differ between jobs (what the sweep varied)."""
    rows = [job_row(d) for d in find_jobs(sweep_dir)]
    if len(rows) > 1:
        common = set.intersection(*(set(r["overrides"]) for r in rows))
        for r in rows:
            r["overrides"] = [o for o in r["overrides"] if o not in common]
    for r in rows:
        r["overrides"] = " ".join(r["overrides"])
    return rows


def _fmt(value: Any, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[c for c, _, _ in COLUMNS], lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({c: "" if r[c] is None else r[c] for c, _, _ in COLUMNS})
    return buf.getvalue()


def to_markdown(rows: list[dict], title: str) -> str:
    lines = [f"# Sweep summary: {title}", ""]
    lines.append("| " + " | ".join(h for _, h, _ in COLUMNS) + " |")
    lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r[c], f).replace("|", "\\|") for c, _, f in COLUMNS) + " |")
    lines += [
        "",
        "Throughputs, step and sync times are means over training steps. Idle: share of step time a role waits "
        "(perf/*_idle_frac when logged, else from the synchronous time split). Final reward: the last step's "
        "sampled mean; eval acc: greedy held-out accuracy after training.",
        "",
    ]
    return "\n".join(lines)


def to_png(rows: list[dict], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    labels = [f"{r['job']}: {r['overrides']}" if r["overrides"] else r["job"] for r in rows]
    x = list(range(len(rows)))
    fig, axes = plt.subplots(2, 3, figsize=(max(12, 1.2 * len(rows) * 3), 7.5))
    for ax, (col, name) in zip(axes.flat, BARS):
        if col == "idle":
            w = 0.4
            for off, key, label in ((-w / 2, "actor_idle_frac", "actors"), (w / 2, "learner_idle_frac", "learners")):
                ax.bar([i + off for i in x], [r[key] or 0.0 for r in rows], width=w, label=label)
            ax.set_ylim(0, 1)
            ax.legend(fontsize=7)
        else:
            ax.bar(x, [r[col] or 0.0 for r in rows])
            for i, r in enumerate(rows):
                if r[col] is None:
                    ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Sweep {title}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def write_summary(sweep_dir: Path) -> list[Path]:
    """Write sweep_summary.{csv,md,png} into `sweep_dir` (each under a temporary name, then renamed)."""
    sweep_dir = Path(sweep_dir)
    rows = build_summary(sweep_dir)
    if not rows:
        raise FileNotFoundError(f"no job directories (with metrics.jsonl or .hydra/overrides.yaml) in {sweep_dir}")
    title = str(sweep_dir)
    paths = [sweep_dir / name for name in FILES]
    contents = (lambda: to_csv(rows).encode(), lambda: to_markdown(rows, title).encode(), lambda: to_png(rows, title))
    for path, content in zip(paths, contents):
        with replace_when_done(path) as tmp:
            tmp.write_bytes(content())  # one at a time: a figure that fails leaves the tables written
    return paths


class SweepSummary(Callback):
    """Hydra callback: write the sweep summary into the sweep directory when a multirun ends."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if config.get("plan"):  # a sweep of preflight plans trained nothing
            return
        paths = write_summary(Path(str(config.hydra.sweep.dir)))
        print(f"sweep summary: {', '.join(str(p) for p in paths)}", flush=True)
