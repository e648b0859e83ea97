"""KL folded into the reward: r - kl_coef * sum_t kl_t, from behaviour and reference logprobs."""

from __future__ import annotations

import math

import pytest

from rl.config.schema import AlgorithmConfig, ConfigError, TrainConfig
from rl.loop.prepare import kl_reward_penalty
from rl.resolve import from_overrides
from rl.types import Completion, PromptRollout


def config(coef: float, estimator: str) -> TrainConfig:
    keys = [f"algorithm.kl_coef={coef}", "algorithm.kl_in_reward=true", f"algorithm.kl_estimator={estimator}"]
    return from_overrides("/fake/model", *keys)


def test_penalty_is_coef_times_summed_token_kl():
    rollouts = [
        PromptRollout([1, 2], [Completion([5, 6], [-1.0, -2.0], "stop", "a"), Completion([7], [-0.5], "stop", "b")], 0)
    ]
    ref = [[-1.5, -2.0], [-0.5]]
    shaped, metrics = kl_reward_penalty(lambda _: ref, rollouts, [1.0, 0.0], config(0.1, "k1").algorithm)
    # k1 on sample 1: (-1 - -1.5) + (-2 - -2) = 0.5; sample 2: 0
    assert shaped == pytest.approx([1.0 - 0.05, 0.0])
    shaped3, _ = kl_reward_penalty(lambda _: ref, rollouts, [1.0, 0.0], config(1.0, "k3").algorithm)
    assert shaped3[0] == pytest.approx(1.0 - (math.exp(-0.5) - 1 + 0.5))
    assert metrics["reward/kl_penalty_mean"] == pytest.approx(0.1 * 0.25)


def test_kl_in_reward_needs_a_coefficient():
    with pytest.raises(ConfigError, match="kl_in_reward=true needs algorithm.kl_coef > 0"):
        AlgorithmConfig(kl_coef=0.0, kl_in_reward=True)
