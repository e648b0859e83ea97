"""reasoning-gym task scorers as rewards, with a configurable answer extraction in front of them."""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(completion: str, mode: str) -> str | None:
    """The answer part of a completion.

    last_number: the last number in the text (commas allowed); answer_tag: the last <answer>...</answer>;
    full: the stripped text.
    """
    if mode == "last_number":
        found = _NUMBER.findall(completion)
        return found[-1].replace(",", "") if found else None
    if mode == "answer_tag":
        from reasoning_gym.utils import extract_answer as rg_extract

        return rg_extract(completion)
    if mode == "full":
        return completion.strip()
    raise ValueError(f"reward.extract={mode!r} is not known; valid: last_number, answer_tag, full")


class ReasoningGymScore:
    """Score each completion with its task's own reasoning-gym scorer (0..1).

    The task comes from each item's metadata (`task`), so mixed-task batches are scored correctly.
    extract: how the answer is taken from the completion (see extract_answer).
    """

    def __init__(self, extract: str = "last_number"):
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
            extracted = extract_answer(text, self.extract)
            if extracted is None:
                scores.append(0.0)
                continue
            entry = {"answer": gt, "metadata": meta}
            try:
                scores.append(float(self._scorer(meta["task"])(extracted, entry)))
            except Exception:  # a scorer must never crash the run: odd input scores 0
                scores.append(0.0)
        return scores
