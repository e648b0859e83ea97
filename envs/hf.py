"""Rows from Hugging Face datasets or local files, mapped to environment items.

A source is a local file (.jsonl, .json, .parquet) or a Hub id (`openai/gsm8k`, loaded with `datasets`, imported
only then). Field mapping: the prompt comes from `messages` (the chat format), `problem`, `question` or `prompt`;
the ground truth from `gt_answer`, `answer` or `solution`; GSM8K's `#### N` and a solution's last `\\boxed{}`
are reduced to the final answer.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.jsonl import foreign_encoding, json_problem, parse_json, read_jsonl, seed_messages, undecodable
from envs.templates import PromptTemplate

PROMPT_FIELDS = ("messages", "problem", "question", "prompt")
ANSWER_FIELDS = ("gt_answer", "answer", "solution")
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass
class Source:
    """One dataset. path: local file or Hub id; name: Hub config (e.g. `main` for openai/gsm8k); split: Hub split;
    prompt_field / answer_field: null = the first present of PROMPT_FIELDS / ANSWER_FIELDS;
    answer_format: auto | gsm8k (text after `####`) | boxed (last \\boxed{}) | raw; limit: first N rows."""

    path: str
    split: str = "train"
    name: str | None = None
    prompt_field: str | None = None
    answer_field: str | None = None
    answer_format: str = "auto"
    limit: int | None = None

    @classmethod
    def of(cls, spec: str | dict[str, Any], where: str) -> Source:
        if isinstance(spec, str):
            return cls(path=spec)
        if not isinstance(spec, dict) or "path" not in spec:
            raise ValueError(f"{where}: a source is a path / Hub id or a mapping with a 'path' key (got {spec!r})")
        unknown = set(spec) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"{where}: unknown source key(s) {sorted(unknown)}; valid: {list(cls.__dataclass_fields__)}"
            )
        src = cls(**spec)
        if src.answer_format not in ("auto", "gsm8k", "boxed", "raw"):
            raise ValueError(
                f"{where}.answer_format={src.answer_format!r} is not known; valid: auto, gsm8k, boxed, raw"
            )
        if src.limit is not None and not (isinstance(src.limit, int) and src.limit >= 1):
            raise ValueError(f"{where}.limit must be a number of rows >= 1, or null for all (got {src.limit!r})")
        return src

    @property
    def is_local(self) -> bool:
        """A single local file; a local folder (a downloaded Hub dataset) goes through `datasets` like a Hub id."""
        return self.path.endswith(LOCAL_SUFFIXES) or Path(self.path).is_file()


def load_rows(src: Source, strict: bool = True) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """([(where, row)], skipped) where `where` names the file and line (or Hub row) for error messages. A local file
    that cannot be read as a whole (another encoding, a broken .json document or parquet file) fails with one line
    naming it, or with strict=False is skipped and counted as one."""
    if src.is_local:
        path = Path(src.path)
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        try:
            if path.suffix == ".parquet":
                rows = [(f"{path} row {i}", r) for i, r in enumerate(parquet_rows(path))]
                return rows[: src.limit], 0
            whole = json_document(path) if path.suffix == ".json" else None
        except ValueError:
            if strict:
                raise
            return [], 1
        if isinstance(whole, list):
            return json_array_rows(path, whole[: src.limit], strict)
        rows, skipped = read_jsonl(path, strict=strict)
        return [(f"{path}:{n}", r) for n, r in rows][: src.limit], skipped
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"env source {src.path!r} is a Hugging Face Hub id and needs the `datasets` package "
            "(pip install datasets), or give a local .jsonl/.json/.parquet path"
        ) from None
    try:
        ds = datasets.load_dataset(src.path, src.name, split=src.split)
    except Exception as e:  # noqa: BLE001 - the Hub's errors share no base class; the line keeps their text
        first = (str(e).splitlines() or [""])[0]
        raise ValueError(
            f"{src.path!r} (a Hugging Face Hub dataset) did not load ({type(e).__name__}: {first}); without network "
            "it must be in the local datasets cache, or set env.train (and env.eval_sets) to local .jsonl / .json / "
            ".parquet files"
        ) from e
    if src.limit is not None:
        ds = ds.select(range(min(src.limit, len(ds))))
    return [(f"{src.path}[{src.split}] row {i}", dict(r)) for i, r in enumerate(ds)], 0


def parquet_rows(path: Path) -> list[dict[str, Any]]:
    """A parquet file's rows; ValueError naming the file when pyarrow is missing or cannot read it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"{path}: reading parquet needs pyarrow (pip install pyarrow), or convert it to jsonl"
        ) from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow's errors (ArrowInvalid, OSError, ...) share no base class
        first = (str(e).splitlines() or [""])[0]
        raise ValueError(f"{path}: not a parquet file pyarrow can read ({type(e).__name__}: {first})") from None


def json_document(path: Path) -> Any:
    """A .json file's content when the whole file is one JSON document spread over lines (a list of rows, or an
    object that is not rows); None when it is one object per line (jsonl under a .json name), read line by line
    (envs/jsonl.py, which names an undecodable line). A document that is not UTF-8 JSON fails naming its line."""
    data = path.read_bytes()
    why = foreign_encoding(data[:4])
    if why:
        raise ValueError(f"{path}:1: {why}")
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if not data.lstrip().startswith(b"["):
            return None
        start, line = data.rfind(b"\n", 0, e.start) + 1, data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: {undecodable(data[start:], e.start - start)}") from None
    if not text.lstrip().startswith("["):
        if len([ln for ln in text.splitlines() if ln.strip()]) < 2:
            return None
        try:
            whole = parse_json(text)
        except ValueError:
            return None  # several lines that are not one document: jsonl, whose reader names the bad line
        if isinstance(whole, dict):
            raise ValueError(
                f"{path}: one JSON object over several lines (keys {sorted(whole)[:5]}), not rows: a .json source "
                "is a list of row objects ([{...}, ...]) or one object per line"
            )
        return whole
    try:
        return parse_json(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not JSON: {e.msg} at column {e.colno}") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def json_array_rows(path: Path, data: list, strict: bool) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """([(where, row)], skipped) of a .json list: each item must be an object, as a jsonl line must be."""
    rows, skipped = [], 0
    for i, r in enumerate(data):
        why = json_problem(r) or (
            None if isinstance(r, dict) else f"a row must be a JSON object, got {type(r).__name__}"
        )
        if why is None:
            rows.append((f"{path} item {i}", r))
        elif strict:
            raise ValueError(f"{path} item {i}: {why} (set env.strict=false to skip bad rows)")
        else:
            skipped += 1
    return rows, skipped


def final_answer(value: Any, fmt: str, where: str, field: str) -> str:
    """The ground-truth answer string of one row."""
    from envs.boxed import last_boxed

    if isinstance(value, float) and value.is_integer():
        value = int(value)  # AMC stores 142.0
    if value is None or isinstance(value, dict | list):
        raise ValueError(f"{where}: '{field}' must be a string or a number (got {type(value).__name__})")
    text = str(value).strip()
    if fmt == "gsm8k" or (fmt == "auto" and "####" in text):
        if "####" not in text:
            raise ValueError(f"{where}: '{field}' has no '#### <answer>' line (answer_format=gsm8k)")
        text = text.rsplit("####", 1)[1].strip().replace(",", "")
    elif fmt == "boxed" or (fmt == "auto" and field == "solution"):
        boxed = last_boxed(text)
        if boxed is None:
            raise ValueError(f"{where}: '{field}' has no \\boxed{{}} answer (answer_format=boxed)")
        text = boxed.strip()
    if not text:
        raise ValueError(f"{where}: '{field}' is empty")
    return text


def _pick(
    row: dict[str, Any], wanted: str | None, candidates: tuple[str, ...], what: str, where: str, key: str, path: str
) -> str:
    if wanted is not None:
        if wanted not in row:
            raise ValueError(f"{where}: missing field '{wanted}' (the {what} field; row has {sorted(row)})")
        return wanted
    for name in candidates:
        if name in row:
            return name
    raise ValueError(
        f"{where}: no {what} field (looked for {', '.join(candidates)}; row has {sorted(row)}); "
        f"name it: '{key}={{path: {path}, {what}_field: <the row's field>}}'"
    )


def row_to_item(
    row: dict[str, Any], src: Source, template: PromptTemplate, where: str, key: str = "env.train"
) -> dict[str, Any]:
    """{messages, answer, metadata} for one row; `key` is the config key of its source (for the fix a missing
    field's error gives)."""
    prompt_field = _pick(row, src.prompt_field, PROMPT_FIELDS, "prompt", where, key, src.path)
    answer_field = _pick(row, src.answer_field, ANSWER_FIELDS, "answer", where, key, src.path)
    if prompt_field == "messages":
        messages = template.messages(seed_messages(row, where))
        question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    else:
        question = row[prompt_field]
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: '{prompt_field}' must be a non-empty string")
        messages = template.messages(question)
    metadata = {"source": src.path, "where": where, "question": question}
    if "unique_id" in row:
        metadata["unique_id"] = row["unique_id"]
    return {
        "messages": messages,
        "answer": final_answer(row[answer_field], src.answer_format, where, answer_field),
        "metadata": metadata,
    }
