"""Policy losses, aggregations and KL (rl/algorithms/): the properties every registered loss and aggregation must
have, run over the registries themselves (a new entry is tested the day it is registered), hand-computed cases,
gradients, and agreement with verl's implementation (tests/unit/verl_reference.py) on random inputs. The advantage
estimators are tests/unit/test_advantages.py's."""

from __future__ import annotations

import math

import pytest
import torch

from rl import algorithms as alg
from rl.config.schema import ConfigError
from rl.config.schema import PolicyLossKnobs as Knobs
from tests.unit import verl_reference

VERL = verl_reference.load()
needs_verl = pytest.mark.skipif(
    VERL is None, reason="verl not installed (pip install --no-deps -r requirements-dev.txt)"
)

LOSSES = sorted(alg.POLICY_LOSSES)
AGGS = sorted(alg.LOSS_AGGREGATIONS)
# Losses that do not read the advantages (test_the_losses_that_ignore_advantages_are_these checks the list)
IGNORES_ADVANTAGES = {"sft"}
# Losses whose gradient is not the derivative of their value on purpose (a stop-gradient weight): no gradcheck
STOP_GRADIENT_WEIGHT = {"cispo"}
PG_LOSSES = [n for n in LOSSES if n not in IGNORES_ADVANTAGES]


def approx(x, **kw):
    return pytest.approx(x, abs=kw.pop("abs", 1e-5), **kw)


def random_batch(B=6, T=7, seed=0, dtype=torch.float64):
    """logp, old_logp [B, T] near each other; advantages [B]; mask [B, T] right-padded with unequal lengths."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    logp = old + 0.3 * torch.randn(B, T, generator=g, dtype=dtype)
    adv = torch.randn(B, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(dtype)
    return logp, old, adv, mask


# ----------------------------------------------------------------------------------------------- registry


def test_the_documented_entries_are_registered():
    assert {"grpo", "dr_grpo", "rloo", "pg", "reinforce_pp"} <= set(alg.ADVANTAGE_ESTIMATORS)
    assert {"pg", "clipped", "gspo", "cispo", "sft"} <= set(alg.POLICY_LOSSES)
    assert {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"} <= set(AGGS)


def test_unknown_name_lists_valid_names_and_duplicates_are_refused():
    with pytest.raises(KeyError, match=r"algorithm.policy_loss='ppo' .*valid names: cispo, clipped, gspo, pg"):
        alg.get_policy_loss("ppo")
    with pytest.raises(ValueError, match="registered twice"):
        alg.register_advantage("grpo")(lambda r, g, **_: r)
    assert alg.get_advantage("grpo") is alg.grpo_advantages


# ----------------------------------------------------------------------------------------------- aggregation


def test_token_mean_and_sequence_means_differ_on_unequal_lengths():
    per_token = torch.tensor([[1.0, 9.0, 9.0, 9.0], [0.0, 0.0, 0.0, 9.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    assert float(alg.agg_token_mean(per_token, mask)) == approx(1 / 4)  # every token weighs the same
    assert float(alg.agg_seq_mean_token_mean(per_token, mask)) == approx(1 / 2)  # every sequence weighs the same
    assert float(alg.agg_seq_mean_token_sum(per_token, mask)) == approx(1 / 2)
    assert float(alg.agg_seq_mean_token_sum_norm(per_token, mask, norm_length=8)) == approx(1 / 16)


def test_fully_masked_sequences_are_not_counted():
    per_token = torch.tensor([[2.0, 2.0], [5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    for name in ("seq_mean_token_mean", "token_mean"):
        assert float(alg.get_loss_agg(name)(per_token, mask)) == approx(2.0)
    assert float(alg.agg_seq_mean_token_sum(per_token, mask)) == approx(4.0)


@pytest.mark.parametrize("agg_name", AGGS)
def test_aggregation_is_a_masked_scalar_that_ignores_fully_masked_rows(agg_name):
    agg = alg.get_loss_agg(agg_name)
    assert agg.unit in ("token", "seq")
    x, _, _, mask = random_batch(seed=12)
    value = agg(x, mask, norm_length=11)
    assert value.dim() == 0 and torch.isfinite(value)
    garbage = torch.where(mask > 0, x, torch.full_like(x, 1e6))
    assert float(agg(garbage, mask, norm_length=11)) == approx(float(value), abs=1e-9)
    extra_row = torch.cat([x, torch.full_like(x[:1], 7.0)]), torch.cat([mask, torch.zeros_like(mask[:1])])
    assert float(agg(*extra_row, norm_length=11)) == approx(float(value), abs=1e-9)


@pytest.mark.parametrize("agg_name", AGGS)
def test_micro_batches_weighted_by_the_unit_add_up_to_the_whole_batch(agg_name):
    """What the learner's gradient accumulation relies on: each micro-batch's value weighted by its share of the
    batch's units (unmasked tokens, or sequences with a token: the aggregation's `unit`) sums to the batch's."""
    agg = alg.get_loss_agg(agg_name)
    x, _, _, mask = random_batch(B=8, seed=13)
    mask[3] = 0  # a fully masked sequence

    def units(m):
        return m.sum() if agg.unit == "token" else (m.sum(1) > 0).to(m.dtype).sum()

    parts = [(x[i : i + 3], mask[i : i + 3]) for i in range(0, 8, 3)]
    accumulated = sum(units(m) / units(mask) * agg(xs, m, norm_length=11) for xs, m in parts)
    assert float(accumulated) == approx(float(agg(x, mask, norm_length=11)), abs=1e-9)


# ----------------------------------------------------------------------------------------------- KL, entropy


def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([0.0]), torch.tensor([math.log(0.5)])
    lr = math.log(2)
    assert float(alg.kl_penalty(logp, ref, "k1")) == approx(lr)
    assert float(alg.kl_penalty(logp, ref, "k2")) == approx(lr**2 / 2)
    assert float(alg.kl_penalty(logp, ref, "k3")) == approx(0.5 - 1 + lr)
    assert float(alg.kl_penalty(ref, ref, "k3")) == 0.0
    with pytest.raises(KeyError, match="kl_estimator"):
        alg.kl_penalty(logp, ref, "k4")


def test_token_entropy_matches_categorical():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(1))
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(alg.token_entropy(logits), expected, atol=1e-6)
    assert torch.allclose(alg.token_entropy(torch.zeros(1, 1, 4)), torch.tensor([[math.log(4)]]))


# ----------------------------------------------------------------------------------------------- losses


def test_pg_loss_hand_computed():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.1), 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, _ = alg.pg_loss(logp, logp, adv, mask, agg=alg.agg_token_mean)
    expected = (-(math.log(0.5) + math.log(0.25)) + 2 * math.log(0.1)) / 3
    assert float(loss.detach()) == approx(expected)


def test_clipped_loss_hand_computed_and_clip_metrics():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 1.1, 0.5]])).requires_grad_()  # ratios 1.5, 1.1, 0.5
    loss, m = alg.clipped_surrogate_loss(
        logp,
        old,
        torch.tensor([2.0]),
        torch.ones(1, 3),
        agg=alg.agg_token_mean,
        knobs=Knobs(clip_low=0.2, clip_high=0.28),
    )
    # A > 0: min(r A, clip(r) A) = 1.28*2 (clipped), 1.1*2, 0.5*2 (unclipped below: min keeps r A)
    assert float(loss.detach()) == approx(-(2.56 + 2.2 + 1.0) / 3)
    loss.backward()
    assert logp.grad[0, 0] == 0.0  # clipped above with A > 0: no gradient
    assert float(logp.grad[0, 1]) == approx(-2 * 1.1 / 3)  # d(-r A / 3)/dlogp = -r A / 3
    assert m["policy/clip_frac_high"] == approx(1 / 3) and m["policy/clip_frac_low"] == 0.0
    assert m["policy/ratio_max"] == approx(1.5)


def test_clipping_bounds_for_negative_advantage_and_dual_clip():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[0.5, 5.0, 1.0]])).requires_grad_()
    adv, mask = torch.tensor([-1.0]), torch.ones(1, 3)
    loss, m = alg.clipped_surrogate_loss(logp, old, adv, mask, agg=alg.agg_token_mean)
    # A < 0: per token -min(r A, clip(r) A) = max(r, clip(r)) * |A|: 0.8 (clipped low), 5.0, 1.0
    assert float(loss.detach()) == approx((0.8 + 5.0 + 1.0) / 3)
    assert m["policy/clip_frac_low"] == approx(1 / 3)
    loss.backward()
    assert logp.grad[0, 0] == 0.0
    logp.grad = None
    loss, m = alg.clipped_surrogate_loss(logp, old, adv, mask, agg=alg.agg_token_mean, knobs=Knobs(dual_clip=3.0))
    assert float(loss.detach()) == approx((0.8 + 3.0 + 1.0) / 3)  # the 5x ratio is capped at c = 3
    assert m["policy/dual_clip_frac"] == approx(1 / 3)
    loss.backward()
    assert logp.grad[0, 1] == 0.0 and logp.grad[0, 2] != 0.0


def test_gspo_uses_the_length_normalised_sequence_ratio():
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, -0.1, 0.3], [0.2, 0.0, 0.0]]).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    loss, _ = alg.gspo_loss(
        logp, old, adv, mask, agg=alg.agg_seq_mean_token_mean, knobs=Knobs(clip_low=0.5, clip_high=0.5)
    )
    s = [math.exp(0.3 / 3), math.exp(0.2 / 2)]  # exp(mean token log ratio) per sequence, inside the clip range
    assert float(loss.detach()) == approx((-s[0] * 1 + s[1] * 1) / 2)
    loss.backward()
    # gradient of the GSPO-token objective: -A_i s_i / |y_i| per token, / B for the sequence mean
    expected = torch.tensor([[-s[0] / 3 / 2] * 3, [s[1] / 2 / 2] * 2 + [0.0]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    tight, _ = alg.gspo_loss(logp.detach(), old, adv, mask, agg=alg.agg_seq_mean_token_mean)
    assert float(tight.detach()) == approx((-(1 + 4e-4) + s[1]) / 2)  # clipped at the paper's 1 + 4e-4 for A > 0


def test_cispo_clips_the_weight_but_keeps_the_gradient():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[2.0, 1.0]])).requires_grad_()
    loss, _ = alg.cispo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2), agg=alg.agg_token_mean)
    assert float(loss.detach()) == approx(-(1.2 * math.log(2.0) + 0.0) / 2)
    loss.backward()
    assert logp.grad.flatten().tolist() == approx([-1.2 / 2, -1.0 / 2])  # the clipped token still learns, at weight 1.2


@pytest.mark.parametrize("loss_name", LOSSES)
@pytest.mark.parametrize("agg_name", AGGS)
def test_masked_tokens_contribute_nothing_to_loss_or_gradient(loss_name, agg_name):
    logp, old, adv, mask = random_batch()
    loss_fn, agg = alg.get_policy_loss(loss_name), alg.get_loss_agg(agg_name)
    garbage_logp = torch.where(mask > 0, logp, torch.full_like(logp, -50.0)).requires_grad_()
    garbage_old = torch.where(mask > 0, old, torch.full_like(old, 30.0))
    clean = logp.clone().requires_grad_()
    kw = dict(agg=agg, knobs=Knobs(clip_low=0.2, clip_high=0.28))
    loss_a, _ = loss_fn(garbage_logp, garbage_old, adv, mask, **kw)
    loss_b, _ = loss_fn(clean, old, adv, mask, **kw)
    assert torch.isfinite(loss_a) and float(loss_a.detach()) == approx(float(loss_b.detach()), abs=1e-9)
    loss_a.backward()
    loss_b.backward()
    assert garbage_logp.grad[mask == 0].abs().max() == 0.0
    assert torch.allclose(garbage_logp.grad, clean.grad)
    assert garbage_logp.grad[mask > 0].abs().max() > 0


@pytest.mark.parametrize("loss_name", LOSSES)
@pytest.mark.parametrize("agg_name", AGGS)
def test_loss_is_a_finite_scalar_with_namespaced_metrics(loss_name, agg_name):
    logp, old, adv, mask = random_batch(seed=14)
    fn = alg.get_policy_loss(loss_name)
    loss, metrics = fn(logp.requires_grad_(), old, adv, mask, agg=alg.get_loss_agg(agg_name))
    assert loss.dim() == 0 and torch.isfinite(loss) and loss.requires_grad
    for key, value in metrics.items():  # floats or detached 0-d tensors (read once per step, no device sync)
        assert "/" in key and (isinstance(value, float) or (value.dim() == 0 and not value.requires_grad)), key


@pytest.mark.parametrize("loss_name", LOSSES)
def test_the_losses_that_ignore_advantages_are_these(loss_name):
    logp, old, adv, mask = random_batch(seed=16)
    fn = alg.get_policy_loss(loss_name)
    flipped = (
        fn(logp, old, adv, mask, agg=alg.agg_token_mean)[0] != fn(logp, old, -adv, mask, agg=alg.agg_token_mean)[0]
    )
    assert bool(flipped) == (loss_name not in IGNORES_ADVANTAGES)


@pytest.mark.parametrize("loss_name", LOSSES)
def test_per_token_advantages_equal_to_their_sequences_give_the_same_loss_and_gradient(loss_name):
    """Advantages [B] and the same values per token [B, T] (the shape algorithm=distill's samples carry) agree."""
    logp, old, adv, mask = random_batch(seed=15)
    fn, results = alg.get_policy_loss(loss_name), []
    for a in (adv, adv.unsqueeze(1).expand_as(mask)):
        x = logp.clone().requires_grad_()
        loss, _ = fn(x, old, a, mask, agg=alg.agg_seq_mean_token_mean)
        loss.backward()
        results.append((loss.detach(), x.grad))
    assert torch.allclose(results[0][0], results[1][0]) and torch.allclose(results[0][1], results[1][1])


@pytest.mark.parametrize("loss_name", [n for n in LOSSES if n not in STOP_GRADIENT_WEIGHT])
def test_loss_gradient_matches_finite_differences(loss_name):
    """autograd's gradient against torch's numerical gradcheck on tiny float64 inputs (smooth region).
    Not cispo: its stop-gradient on the weight makes its gradient differ from the derivative of its value on
    purpose (checked by hand in test_cispo_clips_the_weight_but_keeps_the_gradient)."""
    _, old, adv, mask = random_batch(B=2, T=3, seed=3)
    logp = old + 0.01 * torch.randn(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    fn = alg.get_policy_loss(loss_name)
    # wide clips keep every token away from the clip kinks, where the derivative is not defined
    assert torch.autograd.gradcheck(
        lambda x: fn(x, old, adv, mask, agg=alg.agg_seq_mean_token_mean, knobs=Knobs(clip_low=0.5, clip_high=0.5))[0],
        (logp.requires_grad_(),),
    )


@pytest.mark.parametrize("loss_name", PG_LOSSES)
@pytest.mark.parametrize("agg_name", AGGS)
def test_on_policy_every_policy_gradient_loss_has_the_reinforce_gradient(loss_name, agg_name):
    """At ratio 1 (on-policy) every loss that reads advantages (PPO's clip, GSPO's sequence ratio, CISPO's clipped
    weight...) has vanilla PG's gradient, -A grad log pi under the aggregation."""
    logp, _, adv, mask = random_batch(seed=5)
    grads = []
    for name in ("pg", loss_name):
        x = logp.clone().requires_grad_()
        alg.get_policy_loss(name)(x, logp, adv, mask, agg=alg.get_loss_agg(agg_name))[0].backward()
        grads.append(x.grad)
    assert torch.allclose(*grads)


def test_truncated_importance_sampling_weights_and_skip_threshold():
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    logp = torch.log(torch.tensor([[1.0, 0.5], [0.5, 0.5]])).requires_grad_()  # ratios 2, 1 | 1, 1
    mask, adv = torch.ones(2, 2), torch.tensor([1.0, 1.0])
    loss, m = alg.clipped_surrogate_loss(logp, old, adv, mask, agg=alg.agg_token_mean, knobs=Knobs(tis_cap=1.5))
    # ratio vs the learner itself is 1 (never clipped); the weight min(2, 1.5) = 1.5 corrects the mismatch
    assert float(loss.detach()) == approx(-(1.5 + 1 + 1 + 1) / 4)
    assert m["policy/tis_clip_frac"] == approx(1 / 4)
    # the ratio metrics describe the learner against the tokens' sampler (what the weights correct), not the 1
    assert m["policy/ratio_mean"] == approx((2 + 1 + 1 + 1) / 4) and m["policy/ratio_max"] == approx(2.0)
    assert m["policy/approx_kl"] == approx((2 - 1 - math.log(2)) / 4) and m["policy/clip_frac_high"] == 0
    loss.backward()
    assert logp.grad.flatten().tolist() == approx([-1.5 / 4, -1 / 4, -1 / 4, -1 / 4])
    # skip_threshold: sequence 0 has mean ratio 1.5 > 1.2, so its loss is zeroed (it stays in the normaliser)
    loss, m = alg.pg_loss(logp, old, adv, mask, agg=alg.agg_token_mean, knobs=Knobs(skip_threshold=1.2))
    assert float(loss.detach()) == approx(-2 * math.log(0.5) / 4)
    assert m["policy/skipped_seq_frac"] == approx(0.5)


def test_mismatch_mask_zeroes_tokens_outside_the_ratio_band():
    """IcePop: a token whose learner/actor ratio leaves [1/x, x] adds nothing to the loss or its gradient, and
    still counts in the normaliser; tokens inside the band are untouched."""
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    logp = torch.log(torch.tensor([[1.0, 0.6, 0.5], [0.2, 0.5, 0.5]])).requires_grad_()  # ratios 2, 1.2, 1 | 0.4, 1, 1
    mask, adv = torch.ones(2, 3), torch.tensor([1.0, 1.0])
    knobs = Knobs(clip_low=10.0, clip_high=10.0, mismatch_mask=1.5)  # wide clip: only the mask acts
    loss, m = alg.clipped_surrogate_loss(logp, old, adv, mask, agg=alg.agg_token_mean, knobs=knobs)
    assert float(loss.detach()) == approx(-(1.2 + 1 + 1 + 1) / 6)  # ratios 2 and 0.4 are out of [2/3, 1.5]
    assert m["policy/mismatch_masked_frac"] == approx(2 / 6)
    loss.backward()
    assert logp.grad.flatten().tolist() == approx([0.0, -1.2 / 6, -1 / 6, 0.0, -1 / 6, -1 / 6])
    unmasked, m = alg.clipped_surrogate_loss(logp, old, adv, mask, agg=alg.agg_token_mean, knobs=Knobs(10.0, 10.0))
    assert (
        float(unmasked.detach()) == approx(-(2 + 1.2 + 1 + 0.4 + 1 + 1) / 6) and "policy/mismatch_masked_frac" not in m
    )
    with pytest.raises(ConfigError, match=r"algorithm.mismatch_mask must be 0 \(off\) or > 1"):
        Knobs(mismatch_mask=0.5)


# ----------------------------------------------------------------------------------------------- against verl


@needs_verl
@pytest.mark.parametrize("agg_name", AGGS)  # verl has every aggregation, under the same name with dashes
def test_aggregations_agree_with_verl(agg_name):
    logp, _, _, mask = random_batch(seed=7)
    mask[2] = 0  # a fully masked sequence (a masked truncated response)
    mode = agg_name.replace("_", "-")
    ours = alg.get_loss_agg(agg_name)(logp, mask, norm_length=11)
    ref = VERL.agg_loss(logp, mask, mode, loss_scale_factor=11)
    assert float(ours) == pytest.approx(float(ref), abs=1e-6)


def _verl_loss(fn, logp, old, adv, mask, mode, **cfg):
    return fn(
        old, logp, adv.unsqueeze(1).expand_as(mask), mask, loss_agg_mode=mode, config=verl_reference.ActorConfig(**cfg)
    )[0]


# (our loss, verl's function, our knobs, verl's config) for the same objective
VERL_LOSS_CASES = [
    (
        "clipped",
        "compute_policy_loss_vanilla",
        dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0),
        dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0),
    ),
    (
        "clipped",
        "compute_policy_loss_vanilla",
        dict(clip_low=0.1, clip_high=0.1),
        dict(clip_ratio=0.1, clip_ratio_c=1e9),
    ),  # a huge c switches verl's always-on dual clip off
    (
        "gspo",
        "compute_policy_loss_gspo",
        dict(clip_low=0.05, clip_high=0.08),
        dict(clip_ratio_low=0.05, clip_ratio_high=0.08),
    ),
    (
        "cispo",
        "compute_policy_loss_cispo",
        dict(clip_low=0.2, clip_high=0.28),
        dict(clip_ratio_low=0.2, clip_ratio_high=0.28),
    ),
    ("pg", "compute_policy_loss_gpg", {}, {}),
]
# losses verl has no counterpart of, and why (a new loss goes in one of the two)
NO_VERL_LOSS = {"sft": "verl fine-tunes on demonstrations in a trainer of its own, not through a policy loss"}


def test_every_loss_has_a_verl_reference_or_a_reason():
    assert {case[0] for case in VERL_LOSS_CASES} | set(NO_VERL_LOSS) == set(LOSSES)
    assert not {case[0] for case in VERL_LOSS_CASES} & set(NO_VERL_LOSS)


@needs_verl
@pytest.mark.parametrize("agg_name", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize(("ours_name", "verl_name", "knobs", "cfg"), VERL_LOSS_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_policy_losses_and_gradients_agree_with_verl(ours_name, verl_name, knobs, cfg, agg_name, seed):
    logp, old, adv, mask = random_batch(seed=seed)
    adv = adv * 2  # some tokens in every clip region
    mine = logp.clone().requires_grad_()
    theirs = logp.clone().requires_grad_()
    loss, _ = alg.get_policy_loss(ours_name)(mine, old, adv, mask, agg=alg.get_loss_agg(agg_name), knobs=Knobs(**knobs))
    ref = _verl_loss(getattr(VERL, verl_name), theirs, old, adv, mask, agg_name.replace("_", "-"), **cfg)
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), abs=1e-6)
    loss.backward()
    ref.backward()
    assert torch.allclose(mine.grad, theirs.grad, atol=1e-6)


@needs_verl
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_agree_with_verl(estimator):
    logp, ref, _, _ = random_batch(seed=9)
    assert torch.allclose(alg.kl_penalty(logp, ref, estimator), VERL.kl_penalty(logp, ref, estimator), atol=1e-6)


@pytest.mark.parametrize("loss_name", PG_LOSSES)
def test_positive_weight_scales_only_the_positive_samples(loss_name):
    """W-REINFORCE (algorithm.positive_weight): the loss and gradient of positive-advantage samples are scaled by
    the weight, those of negative-advantage samples are untouched, in every policy loss."""
    logp, old, adv, mask = random_batch(seed=11)
    adv = torch.where(torch.arange(adv.numel()) % 2 == 0, adv.abs() + 0.1, -adv.abs() - 0.1)  # +, -, +, - ...
    fn, agg = alg.get_policy_loss(loss_name), alg.agg_seq_mean_token_mean
    knobs = {"gspo": dict(clip_low=3e-4, clip_high=4e-4)}.get(loss_name, {})
    grads = []
    for weight in (1.0, 0.1):
        x = logp.clone().requires_grad_()
        fn(x, old, adv, mask, agg=agg, knobs=Knobs(**knobs, positive_weight=weight))[0].backward()
        grads.append(x.grad)
    positive = adv > 0
    assert torch.allclose(grads[1][positive], 0.1 * grads[0][positive], atol=1e-7)
    assert torch.equal(grads[1][~positive], grads[0][~positive])
    assert grads[0][positive].abs().max() > 0


def test_positive_weight_is_checked():
    with pytest.raises(ConfigError, match="algorithm.positive_weight must be >= 0"):
        Knobs(positive_weight=-1.0)
