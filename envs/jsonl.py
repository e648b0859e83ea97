"""jsonl files, strictly read: a bad line fails with `file:line` and the reason (or, with strict=False, is
skipped and counted), and the chat training format is converted to environment items.

Strictly means: UTF-8 text (a file in another encoding, or a line that does not decode, is named with the
encoding at fault), standard JSON only (`NaN`, `Infinity` and a key given twice in one object are refused: other
JSON readers reject them or disagree on their value), nesting the parser can follow, and no string a tokenizer
cannot encode (a lone UTF-16 surrogate, which a `\\ud800` escape produces). The .json reader (envs/hf.py) and the
demonstrations reader (rl/data/demos.py) parse with the same rules.

Chat format: {"messages": {"role": "user", "content": ...} or [...], "gt_answer": ...}.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# the UTF-32 marks first: UTF-32-LE's begins with UTF-16-LE's
_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def foreign_encoding(head: bytes) -> str | None:
    """Why a file that starts with `head` is not UTF-8 text (a UTF-16 or UTF-32 byte-order mark), or None."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return f"the file is {name} text (it starts with a {name} byte-order mark): save it as UTF-8"
    return None


def undecodable(line: bytes, bad: int) -> str:
    """The reason for a line of bytes that is not UTF-8: its first bad byte (at offset `bad`) and that column."""
    column = len(line[:bad].decode("utf-8", "replace")) + 1
    return f"not UTF-8 text (byte 0x{line[bad]:02x} at column {column}): save the file as UTF-8"


class _NotPlain:
    """What a non-standard part of a JSON text parses to, so that `json_problem` can name the row holding it."""

    def __init__(self, why: str):
        self.why = why


def _constant(name: str) -> _NotPlain:
    return _NotPlain(f"{name} is not standard JSON: write a number, null or a string")


def _object(pairs: list[tuple[str, Any]]) -> dict | _NotPlain:
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        return _NotPlain(f"key {twice!r} appears twice in one object (JSON readers disagree on which value counts)")
    return obj


def parse_json(text: str) -> Any:
    """`json.loads(text)`, with `NaN`/`Infinity` and objects with a duplicated key parsed to markers that
    `json_problem` reports; ValueError for text that is not JSON or nests deeper than the parser can follow."""
    try:
        return json.loads(text, parse_constant=_constant, object_pairs_hook=_object)
    except RecursionError:
        raise ValueError(
            "not JSON this reader can follow: nested deeper than the interpreter's recursion limit"
        ) from None


def json_problem(value: Any) -> str | None:
    """Why a parsed JSON value is not plain data (a non-standard part, or a string holding a lone surrogate, which no
    tokenizer can encode), or None. Iterative: a value nested to the parser's limit is walked without recursion."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, _NotPlain):
            return v.why
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return (
                    f"a string holds a lone surrogate (\\u{ord(v[e.start]):04x}, half of a UTF-16 pair) that no "
                    "tokenizer can encode: fix its escape"
                )
        elif isinstance(v, dict):
            stack += [*v.keys(), *v.values()]
        elif isinstance(v, list):
            stack += v
    return None


def jsonl_rows(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, parsed value, None) for each non-blank line of `path`, or (line number, None, why) for a line
    that is not plain JSON data in UTF-8; a file in another encoding is one (1, None, why). Lines end at `\\n`,
    `\\r\\n` or `\\r`, as text files are read; a UTF-8 byte-order mark is not row text."""
    with path.open("rb") as f:
        why = foreign_encoding(f.read(4))
        if why:
            yield 1, None, why
            return
        f.seek(0)
        n = 0
        for chunk in f:
            for raw in chunk.splitlines():
                n += 1
                if n == 1:
                    raw = raw.removeprefix(codecs.BOM_UTF8)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    yield n, None, undecodable(raw, e.start)
                    continue
                if line.strip():
                    yield n, *_parse_line(line)


def _parse_line(line: str) -> tuple[Any, str | None]:
    try:
        value = parse_json(line)
    except json.JSONDecodeError as e:
        where = " (the line ends early)" if e.pos >= len(line.rstrip()) else f" at column {e.colno}"
        nul = "; it holds NUL bytes, as UTF-16 text read as UTF-8 does: save the file as UTF-8" if "\0" in line else ""
        return None, f"not JSON: {e.msg}{where}{nul}"
    except ValueError as e:
        return None, str(e)
    return value, json_problem(value)


def read_jsonl(path: str | Path, strict: bool = True) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """([(line number, row)], skipped): one JSON object a line; blank lines are ignored.
    Raises ValueError naming file:line (strict), else skips and counts the line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    rows, skipped = [], 0
    for n, row, why in jsonl_rows(path):
        if why is None and not isinstance(row, dict):
            why = f"a line must be a JSON object, got {type(row).__name__}"
        if why is None:
            rows.append((n, row))
        elif strict:
            raise ValueError(f"{path}:{n}: {why} (set env.strict=false to skip bad lines)")
        else:
            skipped += 1
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
