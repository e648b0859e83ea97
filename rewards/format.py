"""Format rewards (strict and soft) for the two answer styles: `\\boxed{...}` and `<think>...</think><answer>...</answer>`.

A format reward alone is gameable by design (a well-formed wrong answer gets full credit): use it as a small
weighted term beside a correctness reward (conf/reward/boxed_format.yaml) or as a gate (MathReward.format_gate).
"""

from __future__ import annotations

import math
import re
from typing import Any

from envs.boxed import BOX_START, boxed_contents
from rewards.extract import answer_tag_content

_AFTER_FINAL_BOX = re.compile(r"[\s$.!\\\])]*")  # what may follow the final box in strict mode: `$`, `.`, `\]`


def _count(text: str, tag: str) -> int:
    return text.count(tag)


class FormatReward:
    """1 (`score`) when the completion has the expected format, else 0.

    style: boxed | think_answer. mode:
    - strict, boxed: exactly one non-empty `\\boxed{}` and nothing after it but `$`, `.`, `\\]` or spaces;
    - soft, boxed: at least one non-empty `\\boxed{}`;
    - strict, think_answer: the whole completion is `<think>X</think> <answer>Y</answer>` (each tag once,
      X and Y not empty; without the opening `<think>` when think_in_prompt);
    - soft, think_answer: one non-empty answer tag after the thinking section, other text allowed.
    """

    def __init__(self, style: str = "boxed", mode: str = "soft", think_in_prompt: bool = False, score: float = 1.0):
        if style not in ("boxed", "think_answer"):
            raise ValueError(f"reward.style={style!r} is not known; valid: boxed, think_answer")
        if mode not in ("strict", "soft"):
            raise ValueError(f"reward.mode={mode!r} is not known; valid: strict, soft")
        if not math.isfinite(score):
            raise ValueError(f"reward.score must be a finite number (got {score})")
        self.style, self.mode, self.think_in_prompt, self.score = style, mode, think_in_prompt, score

    def ok(self, completion: str) -> bool:
        if self.style == "boxed":
            boxes = boxed_contents(completion)
            if self.mode == "soft":
                return any(b.strip() for b in boxes)
            if len(boxes) != 1 or not boxes[0].strip() or len(BOX_START.findall(completion)) != 1:
                return False
            tail = completion[completion.rindex(boxes[0]) + len(boxes[0]) + 1 :]
            return _AFTER_FINAL_BOX.fullmatch(tail) is not None
        content = answer_tag_content(completion, self.think_in_prompt)
        if content is None or not content.strip():
            return False
        if self.mode == "soft":
            return True
        if _count(completion, "</think>") != 1 or _count(completion, "<think>") != (0 if self.think_in_prompt else 1):
            return False
        # each tag once (counted above), so the lazy groups below cannot backtrack over repeated tags
        opening = "" if self.think_in_prompt else r"<think>"
        m = re.fullmatch(rf"\s*{opening}(.*?)</think>\s*<answer>(.*?)</answer>\s*", completion, flags=re.DOTALL)
        return m is not None and bool(m.group(1).strip())

    def score_one(self, completion: str, answer: Any = None, metadata: dict | None = None) -> float:
        if not isinstance(completion, str):
            raise TypeError(f"completion is {type(completion).__name__}, not str")
        return self.score if self.ok(completion) else 0.0

    def __call__(self, completions: list[str], *, answer: list[Any] | None = None, **kwargs) -> list[float]:
        return [self.score if isinstance(c, str) and self.ok(c) else 0.0 for c in completions]
