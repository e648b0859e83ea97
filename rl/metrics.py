"""Metrics sinks: metrics.jsonl (always), one console line per step, and optionally Weights & Biases.

Only the driver logs; actors and learners return plain dicts. Keys are `/`-namespaced (reward/mean, time/sync_s).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rl.atomic import replace_when_done
from rl.run_files import json_lines


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep the information as a string
    return v


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        *,
        kind: str = "jsonl",
        wandb_mode: str = "offline",
        project: str = "rlft",
        name: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        config: dict | None = None,
        console_every: int = 1,
        total_steps: int = 0,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._file = self.path.open("a", buffering=1)  # line-buffered: every step is on disk when logged
        self.console_every = console_every
        self.total_steps = total_steps
        self.start_progress(0)
        self._wandb = None
        if kind == "wandb" and wandb_mode != "disabled":
            import wandb

            self._wandb = wandb.init(
                project=project,
                name=name,
                group=group,
                tags=list(tags or []),
                config=config,
                mode=wandb_mode,
                dir=str(self.run_dir),
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def log_table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        """`rows` (one dict per sample, as the rollout dumps write them) as a wandb Table `name` at `step`; nothing
        without wandb (the jsonl dump holds the same rows). Columns in first-seen order, a missing field empty,
        anything but text and numbers (an episode's spans, an answer's list) as JSON text."""
        if self._wandb is None or not rows:
            return
        import wandb

        columns = list(dict.fromkeys(k for row in rows for k in row))
        cell = lambda v: v if v is None or isinstance(v, (str, int, float)) else json.dumps(v, default=str)  # noqa: E731
        data = [[cell(row.get(c)) for c in columns] for row in rows]
        self._wandb.log({name: wandb.Table(columns=columns, data=data)}, step=step)

    def value_at(self, step: int, key: str) -> float | None:
        """`key` as a row of `step` already in the file logged it (a resumed run reads its evaluation before
        training back), None when none did."""
        self._file.flush()
        for _, row in json_lines(self.path):
            if isinstance(row, dict) and row.get("step") == step and key in row:
                return row[key]
        return None

    def drop_after(self, step: int) -> int:
        """Remove the rows of steps after `step` (a resumed run redoes them), keeping the rest of the file;
        a line cut by a kill (or bytes a crash left that are not text) is dropped too. Returns how many rows were
        removed."""
        self._file.close()
        keep, dropped = [], 0
        for line, row in json_lines(self.path):
            step_of = row.get("step", 0) if isinstance(row, dict) else None
            if isinstance(step_of, int) and step_of <= step:
                keep.append(line)
            elif line is None or line.strip():
                dropped += 1
        with replace_when_done(self.path) as tmp:
            tmp.write_text("".join(f"{line}\n" for line in keep))
        self._file = self.path.open("a", buffering=1)
        return dropped

    def start_progress(self, steps_done: int) -> None:
        """Start the ETA clock: steps after `steps_done` (0, or the checkpoint's step on resume) are being timed."""
        self._progress_t0, self._progress_initial = time.perf_counter(), steps_done

    def progress(self, step: int) -> str:
        """`[elapsed<remaining]` since start/resume, the ETA from the mean time of the steps run since then."""
        return progress_text(step, self.total_steps, time.perf_counter() - self._progress_t0, self._progress_initial)

    def console(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.console_every and step != self.total_steps:
            return
        keys = [
            ("reward/mean", "reward", "{:.3f}"),
            ("eval/accuracy", "eval_acc", "{:.3f}"),
            ("eval/pass@1", "eval_pass@1", "{:.3f}"),
            ("response/length_mean", "len", "{:.1f}"),
            ("env/turns_mean", "turns", "{:.2f}"),  # multi-turn envs only
            ("env/tool_calls_per_episode", "tools", "{:.2f}"),
            ("env/solved_after_feedback_frac", "solved_late", "{:.2f}"),
            ("eval/solved_after_feedback_frac", "eval_solved_late", "{:.2f}"),
            ("train/loss", "loss", "{:+.4f}"),
            ("policy/approx_kl", "kl", "{:.4f}"),
            ("sync/logprob_abs_diff", "probe", "{:.4f}"),
            ("time/step_s", "step_s", "{:.1f}"),
            ("time/rollout_s", "gen_s", "{:.1f}"),
            ("time/learn_s", "learn_s", "{:.1f}"),
            ("time/sync_s", "sync_s", "{:.2f}"),
        ]
        parts = [f"step {self.progress(step)}" if step > self._progress_initial else f"step {step}/{self.total_steps}"]
        parts += [f"{label} {fmt.format(metrics[k])}" for k, label, fmt in keys if k in metrics]
        print(" | ".join(parts), file=sys.stdout, flush=True)

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def progress_text(step: int, total: int, elapsed_s: float, initial: int = 0) -> str:
    """`12/24 [05:30<05:30]`: steps done of total, time since start/resume, and the time left at the mean pace of
    the steps after `initial` (tqdm's formatting, printed in the console line: no bar redraws in log files)."""
    return tqdm.format_meter(
        step, total, elapsed_s, initial=initial, bar_format="{n_fmt}/{total_fmt} [{elapsed}<{remaining}]"
    )
