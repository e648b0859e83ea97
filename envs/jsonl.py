"""jsonl files, strictly read: a bad line fails with `file:line` and the reason (or, with strict=False, is
skipped and counted), and the chat training format is converted to environment items.

Chat format: {"messages": {"role": "user", "content": ...} or [...], "gt_answer": ...}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path, strict: bool = True) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """([(line number, row)], skipped): one JSON object a line; blank lines are ignored.
    Raises ValueError naming file:line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    rows, skipped = [], 0
    with path.open(encoding="utf-8-sig") as f:  # utf-8-sig: a byte-order mark (Windows editors) is not row text
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:  # its own "line 2 column 1" counts within this one line
                    where = f" at column {e.colno}" if e.lineno == 1 else " (the line ends early)"
                    raise ValueError(f"not JSON: {e.msg}{where}") from None
                if not isinstance(row, dict):
                    raise ValueError(f"a line must be a JSON object, got {type(row).__name__}")
            except ValueError as e:
                if strict:
                    raise ValueError(f"{path}:{n}: {e} (set env.strict=false to skip bad lines)") from None
                skipped += 1
                continue
            rows.append((n, row))
    return rows, skipped


def seed_messages(row: dict[str, Any], where: str) -> list[dict[str, str]]:
    """The `messages` of a chat-format row as a list of {role, content}; ValueError naming `where` otherwise."""
    msgs = row["messages"]
    if isinstance(msgs, dict):
        msgs = [msgs]
    if not isinstance(msgs, list) or not msgs:
        raise ValueError(f"{where}: 'messages' must be a message object or a non-empty list of them")
    for m in msgs:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("content"), str)
            or m.get("role") not in ("system", "user", "assistant")
        ):
            raise ValueError(f"{where}: each message needs a role (system, user or assistant) and a string content")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]
