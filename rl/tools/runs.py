"""Reading what a run wrote: the rows of its metrics.jsonl.

One reader for every tool that consumes metrics.jsonl (plot.py draws them, sweep.py summarises a sweep's jobs),
imported by both, so neither imports the other for it. Standard library only: sweep.py is imported when Hydra
starts.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics.jsonl; a line cut by a killed run is skipped, and a step logged twice keeps its last row."""
    by_step: dict[tuple[int, bool], dict] = {}
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            by_step[(row["step"], "train/loss" in row)] = row
    return [by_step[k] for k in sorted(by_step)]
