"""The reward runner: worker processes, a hard per-sample timeout, error counting, in-process mode."""

from __future__ import annotations

import os
import pickle
import time

import pytest

from rewards.math import BoxedReward
from rewards.runner import RewardRunner


class StallOrFail:
    """A reward that hangs on "hang", raises on "boom", returns NaN on "nan", else 1 (picklable: module level)."""

    def __call__(self, completions, *, answer, **kwargs):
        text = completions[0]
        if text == "hang":
            time.sleep(60)
        if text == "boom":
            raise RuntimeError("boom")
        return [float("nan")] if text == "nan" else [1.0]


class ExitOnDie:
    """A reward whose process dies (os._exit, as a segfault or the OOM killer would end it) on "die", else 1."""

    def __call__(self, completions, *, answer, **kwargs):
        if completions[0] == "die":
            os._exit(3)
        return [1.0]


def test_in_process_counts_errors_and_non_finite_scores():
    runner = RewardRunner(StallOrFail(), workers=0)
    assert runner(["a", "boom", "nan", "b"], answer=["1"] * 4) == [1.0, 0.0, 0.0, 1.0]
    assert runner.pop_metrics() == {"reward/errors": 2.0, "reward/timeouts": 0.0}
    assert runner.pop_metrics() == {"reward/errors": 0.0, "reward/timeouts": 0.0}


def test_workers_kill_a_stuck_sample_and_keep_scoring():
    runner = RewardRunner(StallOrFail(), workers=2, timeout_s=1.0)
    try:
        assert runner(["a", "hang", "b", "boom", "c"], answer=["1"] * 5) == [1.0, 0.0, 1.0, 0.0, 1.0]
        assert runner.pop_metrics() == {"reward/errors": 1.0, "reward/timeouts": 1.0}
        assert runner(["d", "e"], answer=["1", "1"]) == [1.0, 1.0]  # the replaced worker serves again
        assert len(runner._pool) == 2
    finally:
        runner.close()
    assert runner._pool == []


def test_workers_score_math_in_order_with_per_sample_metadata():
    runner = RewardRunner(BoxedReward(), workers=2, timeout_s=10.0)
    try:
        texts = [f"\\boxed{{{i}}}" for i in range(12)]
        assert runner(texts, answer=[str(i) for i in range(12)], metadata=[{}] * 12) == [1.0] * 12
        assert runner(texts, answer=["0"] * 12) == [1.0] + [0.0] * 11
    finally:
        runner.close()


def test_runner_is_picklable_and_validates_its_settings():
    runner = RewardRunner("rewards.math.BoxedReward", workers=0)
    clone = pickle.loads(pickle.dumps(runner))
    assert clone([r"\boxed{2}"], answer=["2"]) == [1.0]
    with pytest.raises(ValueError, match="workers"):
        RewardRunner(BoxedReward(), workers=-1)
    with pytest.raises(ValueError, match="cannot be loaded"):
        RewardRunner("rewards.math.NoSuchReward")


def test_a_worker_that_dies_is_replaced_and_its_sample_scores_0_as_an_error():
    runner = RewardRunner(ExitOnDie(), workers=2, timeout_s=30.0)
    try:
        # the first sample a fresh worker takes kills it: a crash, not a worker that cannot start
        assert runner(["die", "a", "b", "die", "c"], answer=["1"] * 5) == [0.0, 1.0, 1.0, 0.0, 1.0]
        assert runner.pop_metrics() == {"reward/errors": 2.0, "reward/timeouts": 0.0}
        assert runner.workers == 2 and len(runner._pool) == 2 and all(w.proc.is_alive() for w in runner._pool)
        assert runner(["d", "e", "f"], answer=["1"] * 3) == [1.0, 1.0, 1.0]  # the replacements serve
    finally:
        runner.close()
