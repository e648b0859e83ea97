"""reasoning-gym task scorers as rewards, with a configurable answer extraction in front of them.

The default extraction (`final_number`) is hardened against reward hacking (every exploit of rl/tools/reward_check.py;
`python -m rewards.check reward=reasoning_gym` exits 0). The scorers themselves are lenient (chain_sum's accepts
any string that parses to the right number), so what must hold is that the extracted string is the one answer
the completion states:
- a declared answer (`\\boxed{}`, `<answer>...</answer>`) wins over the text; every declared answer must be one
  number and all of them the same one, so a list, `73 or 72`, `73 = 72` or a second box with another value scores
  0; an unclosed or nested box or tag scores 0 (no falling back to the text's last number);
- otherwise the last number of the text, unless it ends a list of numbers (`71, 72`, `71 or 72`, `... 2999 72`):
  hedging between numbers is not an answer;
- numbers that only repeat the question (the whole question, or the task's `expression` such as `0 + 4`) are
  not stated answers, so echoing a question that contains its answer (or `0 + 4` for 4) scores 0;
- a minus sign right after a digit is an operator, not a sign (`0-4` does not state -4), and only ASCII digits
  count (no Unicode folding: look-alike or other-script digits never become an answer).
"""

from __future__ import annotations

import re
from typing import Any

from envs.boxed import BOX_START, boxed_contents

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# final_number: a sign only where a minus cannot be an operator; thousands commas only in groups of three, so
# "71,72" is two numbers (a list), not 7172
_FINAL_NUMBER = re.compile(r"(?:(?<![0-9A-Za-z)\]}])-)?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")
_ONE_NUMBER = re.compile(rf"\s*(?:{_FINAL_NUMBER.pattern})\s*")
_LIST_GAP = re.compile(r"\s*(?:[,;/&]|\bor\b|\band\b)?\s*", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

MODES = ("final_number", "last_number", "answer_tag", "full")


def extract_answer(completion: str, mode: str, metadata: dict | None = None) -> str | None:
    """The answer part of a completion.

    final_number: the one number the completion states (hardened; see the module docstring); last_number: the
    last number in the text (commas allowed; gameable: `rewards.check` fails it); answer_tag: the last
    <answer>...</answer>; full: the stripped text. metadata: the item's (its `question` and `expression`).
    """
    if mode == "final_number":
        return final_number(completion, metadata or {})
    if mode == "last_number":
        found = _NUMBER.findall(completion)
        return found[-1].replace(",", "") if found else None
    if mode == "answer_tag":
        from reasoning_gym.utils import extract_answer as rg_extract

        return rg_extract(completion)
    if mode == "full":
        return completion.strip()
    raise ValueError(f"reward.extract={mode!r} is not known; valid: {', '.join(MODES)}")


def final_number(completion: str, metadata: dict) -> str | None:
    """The one number a completion states as its answer, or None (see the module docstring for the rules)."""
    declared = _declared_answers(completion)
    if declared is None:  # an unclosed or nested box or answer tag
        return None
    if declared:
        numbers = [_unwrap(d) for d in declared]
        if not all(_ONE_NUMBER.fullmatch(n) for n in numbers):
            return None
        values = {n.strip().replace(",", "") for n in numbers}
        return values.pop() if len(values) == 1 else None
    text = _without_question(completion, metadata)
    found = list(_FINAL_NUMBER.finditer(text))
    if not found:
        return None
    if len(found) > 1 and _LIST_GAP.fullmatch(text[found[-2].end() : found[-1].start()]):
        return None  # the last number ends a list of numbers
    return found[-1].group().replace(",", "")


def _declared_answers(completion: str) -> list[str] | None:
    """The content of every answer tag and of every box outside them, in order; None when a box or a tag is
    left open or nested."""
    tags = _ANSWER_TAG.findall(completion)
    if completion.count("<answer>") != len(tags) or completion.count("</answer>") != len(tags):
        return None  # an unclosed tag, or one inside another (the non-greedy match pairs fewer than there are)
    boxes = boxed_contents(completion)
    if len(BOX_START.findall(completion)) != len(boxes):  # unclosed, or a box inside a box
        return None
    return tags + boxed_contents(_ANSWER_TAG.sub(" ", completion))


def _unwrap(answer: str) -> str:
    """A declared answer without `$`, a final period, or one box around all of it (`<answer>\\boxed{7}</answer>`)."""
    s = answer.strip().strip("$").strip().removesuffix(".")
    box = BOX_START.match(s)
    inner = boxed_contents(s)
    if box and len(inner) == 1 and s[box.end() :] == inner[0] + "}":
        return _unwrap(inner[0])
    return s


def _phrase(text: str, joiner: str) -> re.Pattern | None:
    """`text` as a pattern that ignores how its words are spaced (joiner between them), not inside a number."""
    words = text.split()
    if not words:
        return None
    return re.compile(r"(?<![0-9.])" + joiner.join(re.escape(w) for w in words) + r"(?![0-9])")


def _without_question(completion: str, metadata: dict) -> str:
    """The completion with verbatim copies of the question and of the task's expression blanked out."""
    for key, joiner in (("question", r"\s+"), ("expression", r"\s*")):
        value = metadata.get(key)
        pattern = _phrase(value, joiner) if isinstance(value, str) else None
        if pattern is not None:
            completion = pattern.sub(" ", completion)
    return completion


class ReasoningGymScore:
    """Score each completion with its task's own reasoning-gym scorer (0..1).

    The task comes from each item's metadata (`task`), so mixed-task batches are scored correctly.
    extract: how the answer is taken from the completion (see extract_answer; `final_number`, the default, is
    the hardened one).
    """

    def __init__(self, extract: str = "final_number"):
        extract_answer("", extract)  # validate the mode now, not in the middle of a run
        self.extract = extract
        self._scorers: dict[str, Any] = {}

    def _scorer(self, task: str):
        if task not in self._scorers:
            import reasoning_gym

            self._scorers[task] = reasoning_gym.get_score_answer_fn(task)
        return self._scorers[task]

    def __call__(self, completions: list[str], *, answer: list[str], metadata: list[dict], **kwargs) -> list[float]:
        scores = []
        for text, gt, meta in zip(completions, answer, metadata):
            extracted = extract_answer(text, self.extract, meta)
            if extracted is None:
                scores.append(0.0)
                continue
            entry = {"answer": gt, "metadata": meta}
            try:
                scores.append(float(self._scorer(meta["task"])(extracted, entry)))
            except Exception:  # a scorer must never crash the run: odd input scores 0
                scores.append(0.0)
        return scores
