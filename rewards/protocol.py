"""What the training loop may ask of a reward, as `typing.Protocol`s: the call every reward answers, and the
extensions some offer (counters to log, a model judge to be given).

A reward is any callable of `RewardFn`'s shape: a plain function, or a picklable class instance (rewards cross
process boundaries). The extensions are optional: a reward that lacks them still works, and the loop asks for them
only through `pop_metrics` and `needs_judge` below, so the names live here once and a type checker sees them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeGuard, runtime_checkable

# the run's judge engines as a reward sees them: prompts (text) in, one verdict per prompt out (None: too long)
Judge = Callable[[list[str]], list[str | None]]


class RewardFn(Protocol):
    """One reward per completion. The loop passes each completion's `answer` and `metadata` (the env item's), in
    completion order; a reward takes by name what it reads and the rest as `**kwargs`."""

    def __call__(
        self, completions: list[str], *, answer: list[Any], metadata: list[dict], **kwargs: Any
    ) -> list[float]: ...


@runtime_checkable
class ReportsMetrics(Protocol):
    """A reward that counts what happened while it scored (reward/errors and reward/timeouts of rewards/runner.py,
    judge/parse_failures of rewards/judge.py, ...)."""

    def pop_metrics(self) -> dict[str, float]:
        """The counts since the last pop, which resets them."""
        ...


@runtime_checkable
class UsesJudge(Protocol):
    """A reward that may score with a model judge (rewards/judge.py, or a runner or sum holding one): the run starts
    the judge engines when `needs_judge` and hands them over with `bind_judge` before the first step."""

    @property
    def needs_judge(self) -> bool: ...

    def bind_judge(self, judge: Judge) -> None: ...


def pop_metrics(reward: object) -> dict[str, float]:
    """The reward's own counts since the last pop ({} for a reward that keeps none)."""
    return reward.pop_metrics() if isinstance(reward, ReportsMetrics) else {}


def needs_judge(reward: object) -> TypeGuard[UsesJudge]:
    """Whether the reward asks for a model judge (then it takes one with `bind_judge`)."""
    return isinstance(reward, UsesJudge) and bool(reward.needs_judge)
