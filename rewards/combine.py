"""Weighted sums of rewards, and loading any Python callable as a reward."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from rewards.protocol import Judge, UsesJudge, needs_judge, pop_metrics


def load_callable(spec: str | Callable) -> Callable:
    """A callable from `module.attr` or `module:attr` (a class is instantiated with no arguments)."""
    if callable(spec):
        return spec
    module_name, sep, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"reward {spec!r}: give a dotted path such as mypkg.rewards.my_reward")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward {spec!r} cannot be loaded: {e}") from None
    return obj() if isinstance(obj, type) else obj


def score_sample(reward: Callable, completion: str, answer: Any, extra: dict[str, Any]) -> float:
    """One completion's score from a reward: its `score_one` if it has one, else a batch call of size one.
    Exceptions propagate (the caller counts them)."""
    if hasattr(reward, "score_one"):
        return float(reward.score_one(completion, answer, extra.get("metadata")))
    out = reward([completion], answer=[answer], **{k: [v] for k, v in extra.items()})
    return float(list(out)[0])


class WeightedSum:
    """sum_i weight_i * reward_i(completion).

    terms: a list of {reward: <reward object or dotted path>, weight: float}, e.g. 0.9 * boxed + 0.1 * format.
    A term that says `batched = True` (a model judge, rewards/judge.py) or that is itself a runner (no `score_one`
    but a batch call) is called once for the whole batch; the others one completion at a time.
    """

    def __init__(self, terms: list[dict[str, Any]]):
        if not terms:
            raise ValueError("reward.terms is empty: give at least one {reward: ..., weight: ...}")
        self.terms = []
        for i, t in enumerate(terms):
            if "reward" not in t:
                raise ValueError(f"reward.terms[{i}] has no 'reward' key")
            weight = float(t.get("weight", 1.0))
            if not math.isfinite(weight):
                raise ValueError(f"reward.terms[{i}].weight must be a finite number (got {weight})")
            self.terms.append((load_callable(t["reward"]), weight))

    def score_one(self, completion: str, answer: Any, metadata: dict | None = None) -> float:
        return sum(w * score_sample(r, completion, answer, {"metadata": metadata}) for r, w in self.terms)

    def __call__(
        self, completions: list[str], *, answer: list[Any], metadata: list[dict] | None = None, **kwargs
    ) -> list[float]:
        metas = metadata if metadata is not None else [None] * len(completions)
        if not any(_batched(r) for r, _ in self.terms):
            return [self.score_one(c, a, m) for c, a, m in zip(completions, answer, metas)]
        total = [0.0] * len(completions)
        for r, w in self.terms:
            if _batched(r):
                scores = [float(x) for x in r(completions, answer=answer, metadata=list(metas))]
            else:
                scores = [score_sample(r, c, a, {"metadata": m}) for c, a, m in zip(completions, answer, metas)]
            total = [t + w * x for t, x in zip(total, scores)]
        return total

    @property
    def needs_judge(self) -> bool:
        return any(needs_judge(r) for r, _ in self.terms)

    def bind_judge(self, judge: Judge) -> None:
        """Hand the run's judge to every term that may use one (rewards/judge.py)."""
        for r, _ in self.terms:
            if isinstance(r, UsesJudge):
                r.bind_judge(judge)

    def pop_metrics(self) -> dict[str, float]:
        """The terms' own counts (reward/errors, judge/parse_failures, ...), summed where two terms share a key."""
        out: dict[str, float] = {}
        for r, _ in self.terms:
            for k, v in pop_metrics(r).items():
                out[k] = out.get(k, 0.0) + v
        return out


def _batched(reward: Callable) -> bool:
    return bool(getattr(reward, "batched", False))
