"""Filters and reward shaping (rl/data/filters.py) and how a step applies them (rl/loop/prepare.py, rl/loop/sampler.py)."""

from __future__ import annotations

import pytest
import torch

from rl.data import filters
from rl.loop.driver import make_sampler, prompt_data
from rl.loop.prepare import prepare_samples
from rl.resolve import from_overrides
from rl.types import Completion, PromptRollout
from tests.fakes import ConstantTokenizer, ScriptedRuntime


def test_overlong_penalty_follows_dapo_eq13():
    lengths = torch.tensor([10, 15, 16, 18, 20, 25])
    # L_max = 20, L_cache = 5: free up to 15, then (15 - |y|) / 5, -1 at and beyond 20
    assert filters.overlong_penalty(lengths, 20, 5).tolist() == pytest.approx([0, 0, -0.2, -0.6, -1, -1])
    assert filters.overlong_penalty(lengths, 20, 5, factor=0.5).tolist() == pytest.approx(
        [0, 0, -0.1, -0.3, -0.5, -0.5]
    )
    with pytest.raises(ValueError, match="buffer"):
        filters.overlong_penalty(lengths, 20, 21)


def test_default_overlong_buffer_is_min_1024_quarter():
    assert filters.default_overlong_buffer(64) == 16
    assert filters.default_overlong_buffer(20480) == 1024
    assert filters.default_overlong_buffer(2) == 1


def test_dynamic_sampling_drops_all_correct_and_all_wrong_groups():
    rewards = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0])
    assert filters.keep_groups_in_range(rewards, 4, 0.01, 0.99).tolist() == [False, False, True]
    assert filters.keep_groups_in_range(rewards, 4, 0.0, 1.0).tolist() == [True, True, True]


def test_truncated_mask_and_sample_utilization():
    assert filters.truncated_mask(["stop", "length", "stop"]) == [True, False, True]
    assert filters.sample_utilization(3, 12) == 0.25
    assert filters.sample_utilization(0, 0) == 0.0


def test_top_k_per_group_keeps_best_with_stable_ties():
    rewards = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.2, 0.2, 0.2, 0.9])
    assert filters.top_k_per_group(rewards, 4, 2).tolist() == [1, 3, 7, 4]
    with pytest.raises(ValueError, match="top_k"):
        filters.top_k_per_group(rewards, 4, 5)


# ----------------------------------------------------------------------------------------------- driver plumbing


def rollout(lengths_and_reasons, version=0):
    comps = [Completion(list(range(n)), [-0.5] * n, reason, f"t{n}") for n, reason in lengths_and_reasons]
    return PromptRollout([7, 8], comps, adapter_version=version)


def test_prepare_samples_shapes_rewards_masks_truncated_and_selects_top_k():
    keys = [
        "model.max_new_tokens=8",
        "algorithm.group_size=4",
        "algorithm.advantage=dr_grpo",
        "algorithm.overlong_penalty=true",
        "algorithm.overlong_buffer=4",
        "algorithm.filter_truncated_response=true",
    ]
    cfg = from_overrides("/fake/model", *keys, "algorithm.top_k=2")
    rollouts = [rollout([(2, "stop"), (6, "stop"), (8, "length"), (3, "stop")])]
    samples, adv, metrics = prepare_samples(rollouts, [1.0, 1.0, 0.0, 0.0], cfg.algorithm, cfg.completion_tokens)
    shaped = torch.tensor([1.0, 1.0 - 0.5, 0.0 - 1.0, 0.0])  # L_max 8, L_cache 4: length 6 -> -0.5, 8 -> -1
    assert adv.tolist() == pytest.approx((shaped - shaped.mean()).tolist())
    assert metrics["response/masked_truncated_frac"] == 0.25
    assert [len(s.completion_ids) for s in samples] == [2, 6]  # the two best shaped rewards, statistics from all 4
    assert all(s.loss_mask == [] for s in samples)
    top = from_overrides("/fake/model", *keys)
    samples, _, _ = prepare_samples(rollouts, [1.0, 1.0, 0.0, 0.0], top.algorithm, top.completion_tokens)
    assert samples[2].loss_mask == [0] * 8 and samples[0].loss_mask == []


def test_dynamic_sampling_generates_until_the_batch_is_full():
    items = [{"messages": [{"role": "user", "content": f"q{i}"}], "answer": "yes"} for i in range(4)]
    cfg = from_overrides("/m", "model.max_prompt_tokens=10", "model.use_chat_template=false")
    data = prompt_data(items, ConstantTokenizer(), cfg)
    right, wrong = ["yes", "yes"], ["no", "no"]
    runtime = ScriptedRuntime([[right, ["yes", "no"]], [wrong, ["no", "yes"]], [right, right]])

    def reward(texts, *, answer, **_):
        return [float(t == a) for t, a in zip(texts, answer)]

    def sample(runtime, max_rounds: int):
        cfg = from_overrides(
            "/m",
            "run.prompts_per_step=2",
            "algorithm.group_size=2",
            "algorithm.dynamic_sampling=true",
            "algorithm.filter_range=[0.01,0.99]",
            f"algorithm.dynamic_sampling_max_rounds={max_rounds}",
        )
        return make_sampler(cfg, runtime, data, reward, steps=1).next(1)

    batch = sample(runtime, max_rounds=3)
    assert runtime.calls == 2  # the second batch filled the two slots
    assert batch.rewards == [1.0, 0.0, 0.0, 1.0]
    assert batch.stats["data/sample_utilization"] == 0.5 and batch.stats["data/kept_groups"] == 2
    batch = sample(ScriptedRuntime([[right, right]]), max_rounds=1)
    assert len(batch.rollouts) == 2 and batch.stats["data/sample_utilization"] == 0.0  # trains on the last batch
