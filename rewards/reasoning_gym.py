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

Every step is linear in the completion's length (the reward sees whatever the policy wrote, thousands of tokens of
it): answer tags are paired by one scan with `str.find`, and no regular expression here can backtrack over a run of
text (a lazy tag pattern over many unclosed tags, or optional blanks on both sides of a long gap, would: quadratic).
"""

from __future__ import annotations

import re
from typing import Any

# imported with this module, so that a reward worker (rewards/runner.py) pays for it while it starts, not inside
# its first sample's deadline
import reasoning_gym

from envs.boxed import BOX_START, boxed_contents

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# final_number: a sign only where a minus cannot be an operator; thousands commas only in groups of three, so
# "71,72" is two numbers (a list), not 7172
_FINAL_NUMBER = re.compile(r"(?:(?<![0-9A-Za-z)\]}])-)?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")
_LIST_WORDS = frozenset(("", ",", ";", "/", "&"))  # what may stand between two numbers of a list, besides or/and
OPEN_TAG, CLOSE_TAG = "<answer>", "</answer>"

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
    if mode == "answer_tag":  # the last tag's content, as reasoning_gym.utils.extract_answer reads it
        contents = answer_tags(completion)[0]
        return contents[-1].strip() if contents else None
    if mode == "full":
        return completion.strip()
    raise ValueError(f"reward.extract={mode!r} is not known; valid: {', '.join(MODES)}")


def final_number(completion: str, metadata: dict) -> str | None:
    """The one number a completion states as its answer, or None (see the module docstring for the rules)."""
    declared = _declared_answers(completion)
    if declared is None:  # an unclosed or nested box or answer tag
        return None
    if declared:
        numbers = [_unwrap(d).strip() for d in declared]
        if not all(_FINAL_NUMBER.fullmatch(n) for n in numbers):
            return None
        values = {n.strip().replace(",", "") for n in numbers}
        return values.pop() if len(values) == 1 else None
    text = _without_question(completion, metadata)
    found = list(_FINAL_NUMBER.finditer(text))
    if not found:
        return None
    if len(found) > 1 and _list_gap(text[found[-2].end() : found[-1].start()]):
        return None  # the last number ends a list of numbers
    return found[-1].group().replace(",", "")


def _list_gap(gap: str) -> bool:
    """True when `gap`, the text between two numbers, joins them into a list: blanks around nothing, a comma,
    `;`, `/`, `&`, `or` or `and` (any case)."""
    core = gap.strip()
    return core in _LIST_WORDS or (core.isascii() and core.lower() in ("or", "and"))


def answer_tags(text: str) -> tuple[list[str], str]:
    """(the content of every `<answer>...</answer>`, the text with each of them replaced by a space). Each opening
    tag pairs with the first closing tag after it, as a lazy regex pairs them, in one left-to-right scan."""
    contents, outside, pos = [], [], 0
    while (start := text.find(OPEN_TAG, pos)) >= 0 and (end := text.find(CLOSE_TAG, start + len(OPEN_TAG))) >= 0:
        contents.append(text[start + len(OPEN_TAG) : end])
        outside.append(text[pos:start])
        pos = end + len(CLOSE_TAG)
    outside.append(text[pos:])
    return contents, " ".join(outside)


def _declared_answers(completion: str) -> list[str] | None:
    """The content of every answer tag and of every box outside them, in order; None when a box or a tag is
    left open or nested."""
    tags, outside = answer_tags(completion)
    if completion.count(OPEN_TAG) != len(tags) or completion.count(CLOSE_TAG) != len(tags):
        return None  # an unclosed tag, or one inside another (the scan pairs fewer than there are)
    boxes = boxed_contents(completion)
    if len(BOX_START.findall(completion)) != len(boxes):  # unclosed, or a box inside a box
        return None
    return tags + boxed_contents(outside)


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

    def __getstate__(self) -> dict:  # sent to reward workers: the scorers are looked up again there
        return {**self.__dict__, "_scorers": {}}

    def _scorer(self, task: str):
        if task not in self._scorers:
            self._scorers[task] = reasoning_gym.get_score_answer_fn(task)
        return self._scorers[task]

    def __call__(self, completions: list[str], *, answer: list[str], metadata: list[dict], **kwargs) -> list[float]:
        return [self._score(text, gt, meta) for text, gt, meta in zip(completions, answer, metadata)]

    def _score(self, text: Any, gold: Any, meta: Any) -> float:
        """One completion's score in [0, 1]; odd input (no task, a scorer that raises or strays out of [0, 1])
        scores 0, since a scorer must never crash the run."""
        meta = meta if isinstance(meta, dict) else {}
        extracted = extract_answer(text, self.extract, meta) if isinstance(text, str) else None
        if extracted is None:
            return 0.0
        try:
            score = float(self._scorer(meta["task"])(extracted, {"answer": gold, "metadata": meta}))
        except Exception:  # noqa: BLE001
            return 0.0
        return score if 0.0 <= score <= 1.0 else 0.0
