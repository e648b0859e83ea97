"""Advantage estimators (rl/algorithms/advantages.py): the properties every registered estimator must have, run over
the registry itself (a new estimator is tested the day it is registered), hand-computed cases, agreement with
verl's implementation (tests/unit/verl_reference.py), and the call site handing the whole algorithm config over."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch

from rl import algorithms as alg
from rl.config.schema import AdvantageKnobs, AlgorithmConfig, ConfigError
from rl.loop.prepare import prepare_samples
from rl.resolve import from_overrides
from rl.types import Completion, PromptRollout
from tests.unit import verl_reference

VERL = verl_reference.load()
needs_verl = pytest.mark.skipif(
    VERL is None, reason="verl not installed (pip install --no-deps -r requirements-dev.txt)"
)

ESTIMATORS = sorted(alg.ADVANTAGE_ESTIMATORS)
# Knob settings the registry-wide properties run under: every field of AdvantageKnobs is set away from its default in
# at least one (test_every_knob_is_exercised), so a new knob is run through every estimator too
KNOB_VARIANTS = {
    "defaults": AdvantageKnobs(),
    "centred_only": AdvantageKnobs(std_normalize=False),
    "population_std": AdvantageKnobs(std_unbiased=False),
    "group_mean_baseline": AdvantageKnobs(pg_baseline="group_mean", adv_eps=1e-3),
    "clipped": AdvantageKnobs(adv_clip=0.5),
}
# Estimators whose advantage depends on the completions' lengths (the rest must ignore them)
READS_LENGTHS = {"reinforce_pp"}


def rewards_batch(B: int = 5, G: int = 4, seed: int = 0) -> torch.Tensor:
    """[B*G] rewards in {0, 0.5, 1} (ties and a uniform first group for sure), group by group."""
    r = torch.randint(0, 3, (B * G,), generator=torch.Generator().manual_seed(seed)).float() / 2
    r[:G] = 1.0
    return r


def lengths_batch(n: int, seed: int = 0) -> torch.Tensor:
    """[n] loss-token counts, some 0 (a completion filtered out of the loss)."""
    lengths = torch.randint(1, 9, (n,), generator=torch.Generator().manual_seed(seed + 100)).float()
    lengths[1::5] = 0.0
    return lengths


# ----------------------------------------------------------------------------------------------- every estimator


def test_every_knob_is_exercised():
    defaults = AdvantageKnobs()
    varied = {
        f.name
        for k in KNOB_VARIANTS.values()
        for f in dataclasses.fields(k)
        if getattr(k, f.name) != getattr(defaults, f.name)
    }
    assert varied == {f.name for f in dataclasses.fields(AdvantageKnobs)}


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_signature_takes_knobs_and_lengths_and_nothing_else(name):
    """One calling convention, and no `**kwargs` that would swallow a misspelt or forgotten knob."""
    params = inspect.signature(alg.get_advantage(name)).parameters
    assert list(params) == ["rewards", "group_size", "knobs", "lengths"]
    assert params["knobs"].kind is params["lengths"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError):
        alg.get_advantage(name)(rewards_batch(), 4, eps=1e-6)


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("variant", sorted(KNOB_VARIANTS))
@pytest.mark.parametrize("with_lengths", [False, True])
def test_shape_dtype_and_finiteness(name, variant, with_lengths):
    r = rewards_batch()
    lengths = lengths_batch(r.numel()) if with_lengths else None
    adv = alg.get_advantage(name)(r, 4, knobs=KNOB_VARIANTS[variant], lengths=lengths)
    assert adv.shape == r.shape and adv.dtype == torch.float32
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize("name", ESTIMATORS)
def test_the_call_sites_form_with_the_algorithm_config(name):
    """prepare_samples passes the whole algorithm config as the knobs: every estimator accepts it."""
    r = rewards_batch()
    adv = alg.get_advantage(name)(r, 4, knobs=AlgorithmConfig(advantage=name), lengths=lengths_batch(r.numel()))
    assert adv.shape == r.shape and torch.isfinite(adv).all()


@pytest.mark.parametrize("name", ESTIMATORS)
def test_rewards_that_do_not_split_into_groups_are_refused(name):
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        alg.get_advantage(name)(torch.ones(6), 4)


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("variant", sorted(KNOB_VARIANTS))
def test_permuting_a_group_permutes_its_advantages(name, variant):
    """Completions of a group are exchangeable: an estimator sees no order within a group."""
    r, G = rewards_batch(seed=1), 4
    lengths = lengths_batch(r.numel(), seed=1)
    perm = torch.cat([g * G + torch.randperm(G, generator=torch.Generator().manual_seed(g)) for g in range(5)])
    fn, knobs = alg.get_advantage(name), KNOB_VARIANTS[variant]
    assert torch.allclose(
        fn(r[perm], G, knobs=knobs, lengths=lengths[perm]), fn(r, G, knobs=knobs, lengths=lengths)[perm]
    )


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("variant", sorted(KNOB_VARIANTS))
def test_a_better_completion_never_gets_a_smaller_advantage(name, variant):
    r = rewards_batch(seed=2) + torch.linspace(0, 0.1, 20)  # no ties
    adv = alg.get_advantage(name)(r, 4, knobs=KNOB_VARIANTS[variant]).view(-1, 4)
    grouped = r.view(-1, 4)
    better = grouped.unsqueeze(2) > grouped.unsqueeze(1)  # [B, G, G]: completion i beat j
    assert (adv.unsqueeze(2) >= adv.unsqueeze(1) - 1e-6)[better].all()


@pytest.mark.parametrize("name", ESTIMATORS)
def test_uniform_reward_group_gives_zero_advantage(name):
    r = torch.tensor([0.7, 0.7, 0.7, 0.7, 1.0, 0.0, 0.0, 1.0])
    adv = alg.get_advantage(name)(r, 4, knobs=AdvantageKnobs(pg_baseline="group_mean"))
    assert adv[:4].abs().max() == 0.0
    assert adv[4:].abs().max() > 0.1


@pytest.mark.parametrize("name", ESTIMATORS)
def test_lengths_are_read_only_by_the_estimators_that_say_so(name):
    r, fn = rewards_batch(seed=3), alg.get_advantage(name)
    same = torch.equal(fn(r, 4, lengths=lengths_batch(20, seed=3)), fn(r, 4, lengths=torch.ones(20)))
    assert same == (name not in READS_LENGTHS)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_adv_clip_bounds_every_estimator(name):
    """algorithm.adv_clip: each advantage clipped to [-c, c], the others untouched (0: off)."""
    r = rewards_batch(seed=4) * 10  # large enough that pg's raw rewards and the others' extremes exceed c
    lengths = lengths_batch(20, seed=4)
    fn = alg.get_advantage(name)
    free = fn(r, 4, knobs=AdvantageKnobs(pg_baseline="group_mean"), lengths=lengths)
    clipped = fn(r, 4, knobs=AdvantageKnobs(pg_baseline="group_mean", adv_clip=0.5), lengths=lengths)
    assert (free.abs() > 0.5).any()
    assert torch.equal(clipped, free.clamp(-0.5, 0.5))
    assert torch.equal(fn(r, 4, knobs=AdvantageKnobs(adv_clip=0.0)), fn(r, 4))


def test_knob_checks_name_the_key():
    with pytest.raises(ConfigError, match=r"algorithm.adv_clip must be >= 0 \(0: off; got -1"):
        AdvantageKnobs(adv_clip=-1.0)
    with pytest.raises(ConfigError, match="algorithm.adv_eps must be >= 0"):
        AlgorithmConfig(adv_eps=-1e-6)


# ----------------------------------------------------------------------------------------------- hand-computed


def test_grpo_hand_computed_unbiased_and_population_std():
    r = torch.tensor([1.0, 0.0, 0.0])
    s = math.sqrt(1 / 3)  # sample std of [1, 0, 0]
    got = alg.grpo_advantages(r, 3, knobs=AdvantageKnobs(adv_eps=0.0))
    assert got.tolist() == pytest.approx([2 / 3 / s, -1 / 3 / s, -1 / 3 / s], abs=1e-5)
    p = math.sqrt(2 / 9)  # population std
    got = alg.grpo_advantages(r, 3, knobs=AdvantageKnobs(std_unbiased=False, adv_eps=0.0))
    assert got.tolist() == pytest.approx([2 / 3 / p, -1 / 3 / p, -1 / 3 / p], abs=1e-5)
    got = alg.grpo_advantages(r, 3, knobs=AdvantageKnobs(std_normalize=False))
    assert got.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3], abs=1e-5)


def test_dr_grpo_rloo_pg_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0, 2.0])
    assert alg.dr_grpo_advantages(r, 3).tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 1, -1, 0], abs=1e-5)
    # leave-one-out: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5; 3 - mean(1, 2) = 1.5; 1 - 2.5; 2 - 2
    assert alg.rloo_advantages(r, 3).tolist() == pytest.approx([1, -0.5, -0.5, 1.5, -1.5, 0], abs=1e-5)
    assert alg.pg_advantages(r, 3).tolist() == pytest.approx(r.tolist())
    group_mean = alg.pg_advantages(r, 3, knobs=AdvantageKnobs(pg_baseline="group_mean"))
    assert group_mean.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 1, -1, 0], abs=1e-5)
    with pytest.raises(KeyError, match="algorithm.pg_baseline='ema' is not known; valid names: none, group_mean"):
        alg.pg_advantages(r, 3, knobs=AdvantageKnobs(pg_baseline="ema"))


def test_reinforce_pp_divides_by_the_batch_std():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])  # centred per group: [0.5, -0.5, 0, 0], batch mean 0
    var = (0.25 + 0.25) / 3  # unbiased over 4 completions
    expected = [0.5 / math.sqrt(var), -0.5 / math.sqrt(var), 0.0, 0.0]
    no_eps = AdvantageKnobs(adv_eps=0.0)
    assert alg.reinforce_pp_advantages(r, 2, knobs=no_eps).tolist() == pytest.approx(expected, abs=1e-5)
    # token weighting: a 3-token completion counts three times in the batch statistics
    lengths = torch.tensor([3.0, 1.0, 1.0, 1.0])
    c = torch.tensor([0.5, -0.5, 0.0, 0.0])
    mean = (c * lengths).sum() / 6
    std = math.sqrt(float(((c - mean) ** 2 * lengths).sum() / 5))
    got = alg.reinforce_pp_advantages(r, 2, knobs=no_eps, lengths=lengths)
    assert got.tolist() == pytest.approx(((c - mean) / std).tolist(), abs=1e-5)


# ----------------------------------------------------------------------------------------------- against verl


def _verl_grpo(tr, mask, idx):
    return VERL.compute_grpo_outcome_advantage(tr, mask, idx, epsilon=1e-6, norm_adv_by_std_in_grpo=True)[0]


def _verl_dr_grpo(tr, mask, idx):
    return VERL.compute_grpo_outcome_advantage(tr, mask, idx, norm_adv_by_std_in_grpo=False)[0]


def _verl_rloo(tr, mask, idx):
    return VERL.compute_rloo_outcome_advantage(tr, mask, idx)[0]


def _verl_reinforce_pp(tr, mask, idx):
    return VERL.compute_reinforce_plus_plus_baseline_outcome_advantage(tr, mask, idx)[0]


# estimator -> (verl's function on token rewards, our knobs for the same quantity)
VERL_ADVANTAGES = {
    "grpo": (_verl_grpo, AdvantageKnobs(adv_eps=1e-6)),
    "dr_grpo": (_verl_dr_grpo, AdvantageKnobs()),
    "rloo": (_verl_rloo, AdvantageKnobs()),
    "reinforce_pp": (_verl_reinforce_pp, AdvantageKnobs(adv_eps=1e-8)),
}
# estimators verl has no counterpart of, and why (a new estimator goes in one of the two)
NO_VERL_ADVANTAGE = {"pg": "verl's REINFORCE++ without baseline discounts token rewards; plain returns have no twin"}


def test_every_estimator_has_a_verl_reference_or_a_reason():
    assert set(VERL_ADVANTAGES) | set(NO_VERL_ADVANTAGE) == set(ESTIMATORS)
    assert not set(VERL_ADVANTAGES) & set(NO_VERL_ADVANTAGE)


@needs_verl
@pytest.mark.parametrize("name", sorted(VERL_ADVANTAGES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantages_agree_with_verl(name, seed):
    B, G, T = 5, 4, 6
    rewards = rewards_batch(B, G, seed).double()
    lengths = torch.randint(1, T + 1, (B * G,), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).double()  # [B*G, T] right-padded
    token_rewards = torch.zeros_like(mask)  # verl takes token rewards: an outcome reward on the last token
    token_rewards[torch.arange(B * G), lengths - 1] = rewards
    idx = torch.arange(B).repeat_interleave(G).numpy()
    verl_fn, knobs = VERL_ADVANTAGES[name]
    ours = alg.get_advantage(name)(rewards, G, knobs=knobs, lengths=mask.sum(1))
    assert torch.allclose(ours.double().unsqueeze(1) * mask, verl_fn(token_rewards, mask, idx), atol=1e-6)


# ----------------------------------------------------------------------------------------------- the call site


def test_prepare_samples_hands_the_estimator_the_algorithm_config(monkeypatch):
    """The call site passes the algorithm config itself (no fields picked), and the lengths of the completions in the
    loss: a knob reaches the estimator without being named between the schema and the estimator."""
    seen = {}

    def probe(rewards, group_size, *, knobs, lengths=None):
        seen.update(knobs=knobs, group_size=group_size, lengths=lengths)
        return rewards.clone()

    monkeypatch.setitem(alg.ADVANTAGE_ESTIMATORS, "probe", probe)
    cfg = from_overrides("/fake/model", "algorithm.advantage=probe", "algorithm.group_size=2", "algorithm.adv_clip=0.3")
    comps = [Completion(list(range(n)), [-0.5] * n, "stop", "t") for n in (3, 1, 2, 4)]
    rollouts = [PromptRollout([1], comps[:2], 0), PromptRollout([2], comps[2:], 1)]
    _, adv, _ = prepare_samples(rollouts, [1.0, 0.0, 0.5, 0.5], cfg.algorithm, cfg.completion_tokens)
    assert seen["knobs"] is cfg.algorithm and seen["knobs"].adv_clip == 0.3 and seen["group_size"] == 2
    assert seen["lengths"].tolist() == [3.0, 1.0, 2.0, 4.0]
    assert adv.tolist() == [1.0, 0.0, 0.5, 0.5]
