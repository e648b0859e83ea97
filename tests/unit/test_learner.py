"""The PEFT learner on a tiny random model: prompt-prefix sharing is exact, the adapter round-trips, and a step
moves the adapter only when there is signal."""

from __future__ import annotations

import math

import pytest
import torch

from rl.learner import PeftLearner, token_logprobs
from rl.types import Sampling, TrainSample
from tests.helpers import make_samples


def make_learner(path, **kw) -> PeftLearner:
    learner = PeftLearner(
        str(path), dtype="float32", lora_targets=["q_proj", "v_proj", "up_proj"], seed=0, num_threads=1, **kw
    )
    gen = torch.Generator().manual_seed(1)
    for name, p in learner.model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero; give the adapter an effect so the test is not trivial
            p.data.normal_(0, 0.05, generator=gen)
    return learner


def test_shared_prefix_logprobs_equal_full_forward(tiny_model):
    learner = make_learner(tiny_model)
    group = make_samples(groups=1, group_size=4)
    targets, _, _, _ = learner._completion_batch(group)
    with torch.no_grad():
        shared = token_logprobs(learner._shared_prefix_logits(group)[0], targets)
        full = token_logprobs(learner._full_logits(group)[0], targets)
    mask = targets != learner.pad_id
    assert torch.allclose(shared[mask], full[mask], atol=1e-4)


def test_shared_prefix_step_matches_unshared_step(tiny_model):
    samples = make_samples()
    a = make_learner(tiny_model, share_prompt_prefix=True, micro_batch_size=4)
    b = make_learner(tiny_model, share_prompt_prefix=False, micro_batch_size=4)
    ma, mb = a.train_step(samples), b.train_step(samples)
    assert ma["train/loss"] == pytest.approx(mb["train/loss"], abs=1e-5)
    assert ma["train/grad_norm"] == pytest.approx(mb["train/grad_norm"], rel=1e-3)
    pa = dict(a.model.named_parameters())
    for name, p in b.model.named_parameters():
        if p.requires_grad:
            assert torch.allclose(p, pa[name], atol=1e-6), name


def test_micro_batches_never_mix_prompts(tiny_model):
    learner = make_learner(tiny_model, micro_batch_size=3)
    batches = learner._micro_batches(make_samples(groups=2, group_size=4))
    assert [len(b) for b in batches] == [3, 1, 3, 1]
    assert all(len({tuple(s.prompt_ids) for s in b}) == 1 for b in batches)


def test_zero_advantage_batch_leaves_adapter_unchanged(tiny_model):
    learner = make_learner(tiny_model)
    before = learner.adapter_checksum()
    samples = [TrainSample(s.prompt_ids, s.completion_ids, s.old_logprobs, 0.0) for s in make_samples()]
    metrics = learner.train_step(samples)
    assert metrics["train/samples_with_signal"] == 0
    assert learner.adapter_checksum() == before
    moved = learner.train_step(make_samples())
    assert moved["train/grad_norm"] > 0 and learner.adapter_checksum() != before


def test_adapter_round_trips_through_bytes(tiny_model):
    from safetensors.torch import load

    learner = make_learner(tiny_model)
    adapter = learner.get_adapter()
    tensors = load(adapter.weights)
    assert adapter.config["r"] == 16 and sorted(adapter.config["target_modules"]) == ["q_proj", "up_proj", "v_proj"]
    assert any("lora_B" in k and float(v.abs().sum()) > 0 for k, v in tensors.items())


def test_nonfinite_loss_skips_the_optimizer_step(tiny_model):
    learner = make_learner(tiny_model)
    before = learner.adapter_checksum()
    samples = make_samples()
    samples[0].advantage = float("nan")  # e.g. a NaN reward: its group's advantages are NaN
    metrics = learner.train_step(samples)
    assert metrics["train/skipped_nonfinite"] == 1.0 and not math.isfinite(metrics["train/loss"])
    assert learner.adapter_checksum() == before  # the weights never saw the NaN
    assert learner.train_step(make_samples())["train/skipped_nonfinite"] == 0.0
    assert learner.adapter_checksum() != before


def test_learner_generation_logprobs_are_the_learners_own_at_the_temperature(tiny_model):
    learner = make_learner(tiny_model, temperature=0.7)
    learner.version = 3
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    rollouts = learner.generate(prompts, Sampling(n=2, temperature=0.7, max_tokens=6))
    assert [r.prompt_ids for r in rollouts] == prompts and {r.adapter_version for r in rollouts} == {3}
    comps = [(r.prompt_ids, c) for r in rollouts for c in r.completions]
    assert len(comps) == 4 and all(1 <= len(c.token_ids) == len(c.logprobs) <= 6 for _, c in comps)
    # the behaviour logprobs are the learner's own (processed: after temperature), so the first ratio is 1
    again = learner.sequence_logprobs([p for p, _ in comps], [c.token_ids for _, c in comps])
    for (_, c), lp in zip(comps, again):
        assert lp == pytest.approx(c.logprobs, abs=1e-4)
    assert learner.model.training  # back to training mode
