"""Answer extraction: the `\\boxed{...}` contents and the `<answer>...</answer>` content of a completion.

Pure string functions (no math-verify, no sympy), shared one way by the format rewards (rewards/format.py: is
the answer well-formed) and the math rewards (rewards/math.py: is it right), and by envs/hf.py for the gold
answers of boxed solutions.
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


def answer_tag_content(completion: str, think_in_prompt: bool = False) -> str | None:
    """The content of the single `<answer>...</answer>` that follows the thinking section, else None.

    None when there is not exactly one opening and one closing answer tag in order, or when the answer sits
    inside the thinking section. think_in_prompt: the prompt opened `<think>`, so the completion holds only
    `</think>`.
    """
    if completion.count("<answer>") != 1 or completion.count("</answer>") != 1:
        return None
    start, end = completion.index("<answer>"), completion.index("</answer>")
    if end < start:
        return None
    think_end = completion.rfind("</think>")
    if think_end > start or (think_in_prompt and think_end < 0):
        return None
    return completion[start + len("<answer>") : end]
