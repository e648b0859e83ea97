"""`python -m rl.tools.keys [group or key ...]`: every config key with its default and one-line description, read
from the schema (rl/config/schema.py), so that the reference of the keys is written once, beside their checks.

`--markdown` prints the same as tables (for a page of docs, generated, never edited by hand).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import sys
import tokenize
import typing
from typing import Any

from rl.config.schema import TrainConfig
from rl.entry import fail


def field_comments(cls: type) -> dict[str, str]:
    """The trailing `# ...` comment of each field of a dataclass, read from its source (a comment may sit on the
    line where a field's multi-line declaration ends)."""
    out: dict[str, str] = {}
    name, depth = None, 0
    for tok in tokenize.generate_tokens(io.StringIO(inspect.getsource(cls)).readline):
        if tok.type == tokenize.NAME and depth == 0 and name is None and tok.line[: tok.start[1]].strip() == "":
            name = tok.string if tok.line.strip().startswith(f"{tok.string}:") else None
        elif tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.COMMENT and name and depth <= 1:
            out.setdefault(name, tok.string.lstrip("# ").strip())
        elif tok.type == tokenize.NEWLINE:
            name, depth = None, 0
    return out


def _default(f: dataclasses.Field) -> str:
    """A field's default as it is written in YAML or on the command line."""
    value: Any = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
    value = getattr(value, "value", value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return f"[{', '.join(map(str, value))}]" if isinstance(value, list) else str(value)


def groups(schema: type = TrainConfig) -> dict[str, type]:
    """The schema's groups: field name -> dataclass (`model` -> ModelConfig), in declaration order."""
    hints = typing.get_type_hints(schema)
    return {f.name: hints[f.name] for f in dataclasses.fields(schema) if dataclasses.is_dataclass(hints[f.name])}


def rows(schema: type = TrainConfig) -> list[tuple[str, str, str]]:
    """(key, default, description) of every setting: the groups' fields, then the top-level ones."""
    out = []
    for group, cls in groups(schema).items():
        notes = field_comments(cls) | {
            k: v for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for k, v in field_comments(base).items()
        }
        out += [(f"{group}.{f.name}", _default(f), notes.get(f.name, "")) for f in dataclasses.fields(cls)]
    top = field_comments(schema)
    skip = {*groups(schema), "reward", "env", "episodes"}
    out += [(f.name, _default(f), top.get(f.name, "")) for f in dataclasses.fields(schema) if f.name not in skip]
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rl.tools.keys",
        description="Every config key with its default and one-line description, from rl/config/schema.py.",
    )
    parser.add_argument("names", nargs="*", help="groups (run, algorithm, ...) or keys (run.steps); none: every key")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    ns = parser.parse_args(argv)
    every = rows()
    named = lambda key, name: key == name or key.split(".")[0] == name  # noqa: E731 - a key, or a key of a group
    unknown = [n for n in ns.names if not any(named(k, n) for k, _, _ in every)]
    targets = [n for n in unknown if n.split(".")[0] in ("reward", "env")]
    if targets:
        fail(
            f"{', '.join(targets)}: reward and env have no fixed keys, their keys are their _target_'s arguments: "
            "see conf/reward/*.yaml and conf/env/*.yaml, or python train.py --cfg job"
        )
    if unknown:
        fail(f"no config group or key {', '.join(unknown)}; groups: {', '.join(groups())}")
    chosen = [r for r in every if not ns.names or any(named(r[0], n) for n in ns.names)]
    if ns.markdown:
        print("| key | default | what it does |\n|---|---|---|")
        print("\n".join(f"| `{k}` | `{d}` | {note} |" for k, d, note in chosen))
        return
    width = max(len(k) for k, _, _ in chosen)
    print("\n".join(f"{k:<{width}}  {d:<12}  {note}" for k, d, note in chosen))


if __name__ == "__main__":
    main(sys.argv[1:])
