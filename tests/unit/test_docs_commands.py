"""Every `python train.py ...` and `python -m rl.tools.eval ...` command in README.md and docs/ composes: its groups
and keys exist (a documented override Hydra refuses is a broken promise; overrides named in prose, outside a
command, are not read: tests/unit/test_judge_distill.py composes the judge's). Composition only; whether the values pass the schema's checks is tests/unit/test_config.py's business.

Left out of a command: placeholders (`<...>`, `$VAR`, `...`, a bare capital like `run.seed=S`), sweeps (`{0,1}`,
`-m`), `hydra.*` keys; left out whole: commands whose comment says they fail (`# error: ...`) and the one env a
reader is told to write first."""

from __future__ import annotations

import re
import shlex

from hydra import compose, initialize_config_dir

from rl.tools.eval import register_eval_config
from tests.helpers import REPO

register_eval_config()

ENTRY = re.compile(r"python3? (train\.py|-m rl\.tools\.eval)\b(.*)")
# the env docs/environments.md's complete example asks the reader to save as conf/env/letters.yaml
WRITTEN_BY_THE_READER = {"env=letters"}


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(file:line, config name, overrides) of every command in the docs, backslash continuations joined."""
    out = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            start, line = i + 1, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            m = ENTRY.search(line)
            if not m:
                continue
            command, _, comment = m.group(2).partition(" #")
            if comment.strip().startswith("error"):
                continue
            command = re.split(r"\s\||&&|;|`|\)", command)[0]
            try:
                tokens = shlex.split(command)
            except ValueError:  # an unclosed quote: prose, not a command
                continue
            if {"-m", "--multirun", "--help", "-h", "--cfg"} & set(tokens):
                continue
            overrides = [t for t in tokens if "=" in t and not placeholder(t)]
            if overrides and not WRITTEN_BY_THE_READER & set(overrides):
                name = "train" if m.group(1) == "train.py" else "eval"
                out.append((f"{path.relative_to(REPO)}:{start}", name, overrides))
    return out


def placeholder(token: str) -> bool:
    value = token.split("=", 1)[1]
    return (
        token.startswith(("hydra.", "+hydra."))
        or any(c in token for c in "<>$[]{}…")
        or "..." in token
        or re.fullmatch(r"[A-Z]+", value) is not None
    )


def test_every_documented_command_composes():
    commands = documented_commands()
    assert len(commands) > 80 and {name for _, name, _ in commands} == {"train", "eval"}
    failed = []
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for where, name, overrides in commands:
            try:
                compose(config_name=name, overrides=overrides)
            except Exception as e:  # Hydra's errors: a missing key or group option, a bad value
                failed.append(f"{where}: {' '.join(overrides)}: {str(e).splitlines()[0]}")
    assert not failed, "\n".join(failed)
