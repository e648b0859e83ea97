"""Weighted sums of rewards, and loading any Python callable as a reward."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


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
    """

    def __init__(self, terms: list[dict[str, Any]]):
        if not terms:
            raise ValueError("reward.terms is empty: give at least one {reward: ..., weight: ...}")
        self.terms = []
        for i, t in enumerate(terms):
            if "reward" not in t:
                raise ValueError(f"reward.terms[{i}] has no 'reward' key")
            self.terms.append((load_callable(t["reward"]), float(t.get("weight", 1.0))))

    def score_one(self, completion: str, answer: Any, metadata: dict | None = None) -> float:
        return sum(w * score_sample(r, completion, answer, {"metadata": metadata}) for r, w in self.terms)

    def __call__(
        self, completions: list[str], *, answer: list[Any], metadata: list[dict] | None = None, **kwargs
    ) -> list[float]:
        metas = metadata if metadata is not None else [None] * len(completions)
        return [self.score_one(c, a, m) for c, a, m in zip(completions, answer, metas)]
