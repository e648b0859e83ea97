"""Reading what a run wrote: the rows of its metrics.jsonl and its summary.json.

One reader for every consumer of these files (plot.py draws the rows, sweep.py summarises a sweep's jobs, the metrics
logger trims the rows a resumed run redoes, a resume tells a finished run by its summary), so that a file a kill or
a disk left damaged is read the same way everywhere: a damaged line of metrics.jsonl is skipped, a damaged summary
is an error naming the file. Standard library only: sweep.py is imported when Hydra starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def json_lines(path: Path) -> list[tuple[str | None, Any]]:
    """(text, value) for each line of a JSON-lines file; value None for a line that is not JSON (cut by a kill), text
    and value None for bytes that are not UTF-8 text (a tail a crash left as garbage)."""
    out: list[tuple[str | None, Any]] = []
    for raw in Path(path).read_bytes().splitlines():
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            out.append((None, None))
            continue
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError:
            out.append((line, None))
    return out


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics.jsonl; a line cut by a killed run is skipped, and a step logged twice keeps its last row."""
    by_step: dict[tuple[int, bool], dict] = {}
    for _, row in json_lines(path):
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            by_step[(row["step"], "train/loss" in row)] = row
    return [by_step[k] for k in sorted(by_step)]


class DamagedFile(ValueError):
    """A file a run wrote that cannot be read back; the message names it and says why."""


def read_summary(path: Path) -> dict | None:
    """A run's summary.json (written whole when the run finished); None when there is none. DamagedFile when it is
    not a JSON object (the run writes it under a temporary name and renames it, so only something outside the run,
    a disk fault or a hand edit, leaves it so)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DamagedFile(f"{path} is damaged ({type(e).__name__}: {e})") from None
    if not isinstance(summary, dict):
        raise DamagedFile(f"{path} is damaged (a JSON {type(summary).__name__}, not an object)")
    return summary
