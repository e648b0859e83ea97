"""The `\\boxed{...}` notation, parsed (balanced braces): the prompt sources read the gold answer of a boxed
solution with it (envs/hf.py), and the rewards read a completion's answer with it (rewards/extract.py). It lives
here, below both, so that envs never import rewards.
"""

from __future__ import annotations

import re

BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_contents(text: str) -> list[str]:
    """Contents of every top-level `\\boxed{...}` / `\\fbox{...}`, in order (balanced braces; an unclosed box is
    ignored; `\\{` and `\\}` do not count as braces)."""
    out, pos = [], 0
    while True:
        m = BOX_START.search(text, pos)
        if m is None:
            return out
        depth, i = 1, m.end()
        while i < len(text) and depth:
            ch = text[i]
            if ch == "\\":
                i += 2
                continue
            depth += (ch == "{") - (ch == "}")
            i += 1
        if depth:
            return out
        out.append(text[m.end() : i - 1])
        pos = i


def last_boxed(text: str) -> str | None:
    found = boxed_contents(text)
    return found[-1] if found else None
