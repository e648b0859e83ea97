"""Math answer rewards: the last `\\boxed{...}` or a `<think>...</think><answer>...</answer>` answer, checked
against the ground truth with math-verify, with a normalised exact-match fallback.

Why our own extraction in front of math-verify: on a whole completion math-verify treats
several boxed answers as a set and falls back to the last number when nothing is boxed, both of which a policy
can game. Here the answer is cut out first (balanced braces, rewards/extract.py), then only that string is parsed.

Hardening against reward hacking (each exploit is in rl/tools/reward_check.py):
- several boxed answers that disagree score 0 (`multiple_boxed="reject"`), so listing candidates never pays;
- an answer longer than `max_answer_chars` scores 0 without being parsed (adversarial strings can hang sympy);
- an equation must be `name = value` or a true constant equation (`\\boxed{19 = 18}` is not 18);
- no Unicode folding: look-alike letters never become digits.

Each `score_one` may raise on odd input; `__call__` turns that into 0 and counts it in `self.errors`.
rewards/runner.py calls `score_one` directly so it can count errors and enforce a hard per-sample timeout.
"""

from __future__ import annotations

import math
import re
import threading
from functools import lru_cache
from typing import Any

from envs.boxed import boxed_contents
from rewards.extract import answer_tag_content
from rewards.format import FormatReward


class RewardTimeout(TimeoutError):
    """math-verify ran past its time limit on one sample (counted as a timeout, scored 0)."""


# ------------------------------------------------------------------------------------------------ normalisation


_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;:! ]|\\left|\\right|\\displaystyle|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")


def normalize_answer(s: str) -> str:
    """A canonical string for the exact-match fallback: no `$`, spacing commands, `\\left/\\right`, `\\text{}`
    wrappers, degree signs, trailing `%` or `.`, whitespace; `\\dfrac`/`\\tfrac` -> `\\frac`; lower case.
    Unicode is not folded (look-alike letters must stay different)."""
    s = s.strip().strip("$")
    s = _TEXT_CMD.sub(r"\1", s)
    s = _SPACING.sub("", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    s = re.sub(r"\s+", "", s).rstrip(".").removesuffix("%")
    return s.lower()


# ------------------------------------------------------------------------------------------------ equivalence


def _timeout_arg(timeout_s: float) -> int | None:
    # math-verify times out with signal.alarm (whole seconds), which only works in the main thread
    if timeout_s <= 0 or threading.current_thread() is not threading.main_thread():
        return None
    return max(1, math.ceil(timeout_s))


def _strip_percent(s: str) -> str:
    # "$10\%$" does not parse in math-verify 0.9; a trailing percent sign is a unit: "10%" answers "10"
    s = s.strip()
    for suffix in ("\\%", "%"):
        if s.endswith(suffix):
            return s[: -len(suffix)].rstrip()
    return s


@lru_cache(maxsize=8192)
def parse_math(s: str, timeout: int | None) -> tuple:
    """math-verify's parse of one answer string (LaTeX between `$`), as a tuple; () when it does not parse."""
    from math_verify import LatexExtractionConfig, parse
    from math_verify.errors import TimeoutException

    try:
        found = parse(
            f"${_strip_percent(s)}$",
            extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
            fallback_mode="no_fallback",
            extraction_mode="first_match",
            parsing_timeout=timeout,
            raise_on_error=True,
        )
    except TimeoutException:
        raise RewardTimeout(f"math-verify parse took over {timeout}s") from None
    except Exception:  # noqa: BLE001 - an answer sympy cannot read is simply not a parsed answer
        return ()
    return tuple(found)


def _dubious_equation(pred: Any, gold: Any) -> bool:
    """math-verify compares an equation with a non-equation gold by its right side only, so `19 = 18` and
    `p + q = p - q` would pass for 18 and p - q. Accept `name = value`, or a constant equation that is true."""
    import sympy

    if not isinstance(pred, sympy.Equality) or isinstance(gold, sympy.Equality):
        return False
    if isinstance(pred.lhs, sympy.Symbol):
        return False
    if pred.lhs.free_symbols:
        return True
    try:
        return bool(sympy.simplify(pred.lhs - pred.rhs) != 0)
    except Exception:  # noqa: BLE001
        return True


def answers_match(pred: str, gold: str, timeout_s: float = 5.0) -> bool:
    """True when `pred` is the same answer as `gold`: equal after normalize_answer, or equivalent by math-verify."""
    norm_gold = normalize_answer(gold)
    if norm_gold and normalize_answer(pred) == norm_gold:
        return True
    timeout = _timeout_arg(timeout_s)
    gold_parsed, pred_parsed = parse_math(gold, timeout), parse_math(pred, timeout)
    if not gold_parsed or not pred_parsed or _dubious_equation(pred_parsed[0], gold_parsed[0]):
        return False
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=timeout, raise_on_error=True))
    except TimeoutException:
        raise RewardTimeout(f"math-verify verify took over {timeout}s") from None
    except Exception:  # noqa: BLE001 - sympy failing to compare two answers means they are not shown equal
        return False


def _boxes_agree(boxes: list[str], timeout_s: float, max_chars: int, max_distinct: int = 4) -> bool:
    """True when every boxed answer is the same answer as the last one (`18` and `18.0` agree). Boxes that differ
    and are longer than `max_chars` disagree unparsed, as an over-long answer scores wrong unparsed."""
    distinct = list(dict.fromkeys(normalize_answer(b) for b in boxes))
    if len(distinct) <= 1:
        return True
    if len(distinct) > max_distinct or any(len(b) > max_chars for b in boxes):  # no need to parse them
        return False
    return all(answers_match(b, boxes[-1], timeout_s) for b in boxes[:-1])


# ------------------------------------------------------------------------------------------------ rewards


class MathReward:
    """Correctness of the extracted answer, with optional format gating and configurable values.

    score = correct_score  if the answer matches (and, when format_gate, the format is right)
            format_score   else if the format is right
            wrong_score    otherwise
    Defaults give 1/0/0 (pure correctness). The 10/5/0 scheme, which also pays for the format alone:
    correct_score=10, format_score=5, format_gate=true (conf/reward/seed_10_5_0.yaml).
    timeout_s: math-verify's per-call limit (the hard per-sample limit is rewards/runner.py's).
    max_answer_chars: longer extracted answers score wrong without being parsed.
    """

    answer_style = "boxed"

    def __init__(
        self,
        correct_score: float = 1.0,
        format_score: float = 0.0,
        wrong_score: float = 0.0,
        format_gate: bool = False,
        format_mode: str = "soft",
        timeout_s: float = 5.0,
        max_answer_chars: int = 300,
    ):
        for key, value in (
            ("correct_score", correct_score),
            ("format_score", format_score),
            ("wrong_score", wrong_score),
        ):
            if not math.isfinite(value):
                raise ValueError(f"reward.{key} must be a finite number (got {value})")
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be > 0 seconds (got {timeout_s})")
        if not max_answer_chars >= 1:
            raise ValueError(f"reward.max_answer_chars must be >= 1 (got {max_answer_chars})")
        self.correct_score, self.format_score, self.wrong_score = correct_score, format_score, wrong_score
        self.format_gate = format_gate
        self.format = FormatReward(style=self.answer_style, mode=format_mode)
        self.timeout_s = timeout_s
        self.max_answer_chars = max_answer_chars
        self.errors = 0

    def extract(self, completion: str) -> str | None:
        raise NotImplementedError

    def score_one(self, completion: str, answer: Any, metadata: dict | None = None) -> float:
        if not isinstance(completion, str):
            raise TypeError(f"completion is {type(completion).__name__}, not str")
        if answer is None:
            raise ValueError("ground-truth answer is None")
        gold = str(answer)
        format_ok = self.format.score_one(completion) > 0
        pred = self.extract(completion)
        correct = (
            pred is not None
            and 0 < len(pred.strip()) <= self.max_answer_chars
            and answers_match(pred, gold, self.timeout_s)
        )
        if correct and (format_ok or not self.format_gate):
            return self.correct_score
        return self.format_score if format_ok else self.wrong_score

    def __call__(
        self, completions: list[str], *, answer: list[Any], metadata: list[dict] | None = None, **kwargs
    ) -> list[float]:
        metas = metadata if metadata is not None else [None] * len(completions)
        scores = []
        for text, gold, meta in zip(completions, answer, metas):
            try:
                scores.append(float(self.score_one(text, gold, meta)))
            except Exception:  # noqa: BLE001 - a reward never crashes the run: odd input scores 0, counted
                self.errors += 1
                scores.append(0.0)
        return scores


class BoxedReward(MathReward):
    """The last `\\boxed{...}` of the completion against the ground truth.

    multiple_boxed: "reject" (default) scores 0 when boxed answers disagree (after normalisation), so listing
    candidates never pays; "last" takes the last box (lenient: a completion may try several answers).
    """

    answer_style = "boxed"

    def __init__(self, multiple_boxed: str = "reject", **kwargs):
        if multiple_boxed not in ("reject", "last"):
            raise ValueError(f"reward.multiple_boxed={multiple_boxed!r} is not known; valid: reject, last")
        super().__init__(**kwargs)
        self.multiple_boxed = multiple_boxed

    def extract(self, completion: str) -> str | None:
        found = boxed_contents(completion)
        if not found:
            return None
        if self.multiple_boxed == "reject" and not _boxes_agree(found, self.timeout_s, self.max_answer_chars):
            return None
        return found[-1]


class ThinkAnswerReward(MathReward):
    """`<think>...</think><answer>...</answer>`: the answer tag's content (its last `\\boxed{}` if it has one)
    against the ground truth. think_in_prompt: the chat template already opened `<think>` (R1-style prompts),
    so the completion starts inside the thinking section."""

    answer_style = "think_answer"

    def __init__(self, think_in_prompt: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.format = FormatReward(
            style="think_answer", mode=kwargs.get("format_mode", "soft"), think_in_prompt=think_in_prompt
        )
        self.think_in_prompt = think_in_prompt

    def extract(self, completion: str) -> str | None:
        content = answer_tag_content(completion, think_in_prompt=self.think_in_prompt)
        if content is None:
            return None
        boxes = boxed_contents(content)
        if not _boxes_agree(boxes, self.timeout_s, self.max_answer_chars):
            return None
        return boxes[-1] if boxes else content.strip()
