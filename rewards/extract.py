"""Answer extraction: the `<answer>...</answer>` content of a completion (the `\\boxed{...}` contents: envs/boxed.py).

Pure string functions (no math-verify, no sympy), shared one way by the format rewards (rewards/format.py: is
the answer well-formed) and the math rewards (rewards/math.py: is it right). The boxed parser itself is
envs/boxed.py's (the prompt sources read gold answers with it too).
"""

from __future__ import annotations


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
