"""Policy losses, registered by name (`algorithm.policy_loss`), and the importance terms they share (truncated IS,
sequence skipping, the mismatch mask, the positive-sample weight).

Called as `fn(logp, old_logp, advantages, mask, *, agg, knobs) -> (loss, metrics)`: logp, old_logp, mask [B, T];
advantages [B], or [B, T] when samples carry per-token terms (`per_token_advantages` broadcasts either);
`old_logp` are the behaviour logprobs returned by the rollout engine; `agg` is the registered aggregation
(rl/algorithms/aggregation.py); `knobs` is the algorithm config, a `PolicyLossKnobs` (rl/config/schema.py), of
which each loss reads the fields it uses. A new knob is a field there and its use here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rl.algorithms.aggregation import masked_mean
from rl.algorithms.registry import Metrics, register_policy_loss
from rl.config.schema import PolicyLossKnobs

DEFAULT_KNOBS = PolicyLossKnobs()


def per_token_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages in a shape that broadcasts over tokens: one per sequence [B] -> [B, 1]; per token [B, T] (the
    sequence's advantage plus a per-token term, e.g. algorithm=distill's reverse KL) as they are."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def importance_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    knobs: PolicyLossKnobs,
    *,
    tis: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, Metrics]:
    """The log importance ratio a surrogate clips, and a per-token weight (no gradient) on its loss. [B, T] each.

    tis_cap <= 0: the ratio is pi_theta / pi_behaviour (behaviour logprobs from the rollout engine), so clipping
      also bounds the train-inference mismatch; weight = 1.
    tis_cap > 0: truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
      off-policy RL training", eq. 3; Espeholt et al. 2018, IMPALA's truncated rho): the ratio is
      pi_theta / sg(pi_theta) (value 1, the on-policy gradient) and weight = min(pi_learner / pi_behaviour, C).
      This uses the learner's own logprobs as the proximal policy, which is exact while every rollout batch gets
      one optimizer step (algorithm.updates_per_step = 1; the config enforces it).
    skip_threshold > 0: sequences whose mean token ratio pi_learner / pi_behaviour exceeds it get weight 0. They
      still count in the loss normaliser.
    mismatch_mask > 1: tokens whose pi_learner / pi_behaviour lies outside [1/mismatch_mask, mismatch_mask] get
      weight 0 (IcePop, Ling Team 2025, "Every Step Evolves: Scaling RL for Trillion-Scale Thinking Model", eq. 4:
      a token the two engines disagree on that much carries the mismatch's noise, not signal). They still count
      in the loss normaliser.
    positive_weight != 1: the loss of samples with a positive advantage is scaled by it (W-REINFORCE, Zhu et al.
      2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning", section 5: lambda = 0.1
      keeps most of the learning on pushing down wrong answers, which preserves the model's diversity).
    `tis=False`: a loss whose ratio is not per token (GSPO, CISPO) ignores tis_cap.
    """
    tis_cap = knobs.tis_cap if tis else 0.0
    skip_threshold = knobs.skip_threshold
    with torch.no_grad():
        behaviour_log_ratio = (logp - old_logp) * mask  # [B, T]
        weight = torch.ones_like(logp)
        metrics: Metrics = {}
        if tis_cap > 0:
            is_ratio = torch.exp(behaviour_log_ratio)
            weight = torch.clamp(is_ratio, max=tis_cap)
            metrics["policy/tis_clip_frac"] = masked_mean((is_ratio > tis_cap).float(), mask)
        if skip_threshold > 0:
            seq_ratio = (torch.exp(behaviour_log_ratio) * mask).sum(1) / mask.sum(1).clamp(min=1)  # [B]
            keep = (seq_ratio <= skip_threshold).to(logp.dtype)  # [B]
            weight = weight * keep.unsqueeze(1)
            metrics["policy/skipped_seq_frac"] = (1 - keep.mean()) if keep.numel() else 0.0
        if knobs.mismatch_mask > 0:
            band = math.log(knobs.mismatch_mask)
            inside = (behaviour_log_ratio.abs() <= band).to(logp.dtype)  # [B, T]
            weight = weight * inside
            metrics["policy/mismatch_masked_frac"] = masked_mean(1 - inside, mask)
        if knobs.positive_weight != 1.0:
            positive = (per_token_advantages(advantages) > 0).to(logp.dtype)  # [B, 1] or [B, T]
            weight = weight * (1 + (knobs.positive_weight - 1) * positive)
    log_ratio = (logp - logp.detach()) if tis_cap > 0 else (logp - old_logp) * mask
    return log_ratio, weight, metrics


def _ratio_metrics(ratio: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor) -> Metrics:
    with torch.no_grad():
        return {
            "policy/ratio_mean": masked_mean(ratio, mask),
            # 1.0 when no token is in the mask, decided on the device
            "policy/ratio_max": torch.where(mask.any(), ratio.masked_fill(mask == 0, float("-inf")).amax(), 1.0)
            if ratio.numel()
            else 1.0,
            # KL(pi_old || pi) by k3 on tokens sampled from pi_old: (r - 1) - log r
            "policy/approx_kl": masked_mean(ratio - 1 - log_ratio, mask),
        }


@register_policy_loss("pg")
def pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg: Callable[..., torch.Tensor],
    knobs: PolicyLossKnobs = DEFAULT_KNOBS,
) -> tuple[torch.Tensor, Metrics]:
    """Vanilla policy gradient, per token -A * log pi(y_t) (Williams 1992, REINFORCE, eq. 11).

    logp, old_logp, mask: [B, T]; advantages: [B]. On-policy by assumption: old_logp only enters through the
    optional truncated-IS weight and skip_threshold (see `importance_terms`).
    """
    _, weight, metrics = importance_terms(logp, old_logp, advantages, mask, knobs)
    per_token = -per_token_advantages(advantages) * logp * weight  # [B, T]
    loss = agg(per_token, mask)
    with torch.no_grad():
        log_ratio = (logp - old_logp) * mask
        metrics.update(_ratio_metrics(torch.exp(log_ratio), log_ratio, mask))
    return loss, metrics


@register_policy_loss("sft")
def sft_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg: Callable[..., torch.Tensor],
    knobs: PolicyLossKnobs = DEFAULT_KNOBS,
) -> tuple[torch.Tensor, Metrics]:
    """Supervised fine-tuning on demonstrations (algorithm=sft): per token -log pi(y_t), the cross-entropy of the
    demonstration's model tokens (the mask leaves the prompt and the environment's tokens out, as in RL). There
    is no behaviour policy and no advantage: `old_logp` and `advantages` are not read."""
    return agg(-logp, mask), {}


@register_policy_loss("clipped")
def clipped_surrogate_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg: Callable[..., torch.Tensor],
    knobs: PolicyLossKnobs = DEFAULT_KNOBS,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with separate low/high clips (DAPO clip-higher, eq. 10).

    per token: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A); r = exp(logp - old_logp).
    dual_clip = c > 1 (Ye et al. 2020, arXiv 1912.09729, eq. 5): for A < 0 the loss is also capped at -c A, so
    a huge ratio on a negative-advantage token cannot dominate. 0 disables it.
    logp, old_logp, mask: [B, T]; advantages: [B] (broadcast over tokens). old_logp are the behaviour logprobs
    returned by the rollout engine, so the ratio also corrects for the train-inference mismatch.
    """
    clip_low, clip_high, dual_clip = knobs.clip_low, knobs.clip_high, knobs.dual_clip
    log_ratio, weight, metrics = importance_terms(logp, old_logp, advantages, mask, knobs)
    ratio = torch.exp(log_ratio)  # [B, T]
    adv = per_token_advantages(advantages)  # [B, 1] or [B, T]
    unclipped = -ratio * adv
    clipped = -torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip > 0:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -dual_clip * adv), per_token)
    loss = agg(per_token * weight, mask)
    with torch.no_grad():
        low = ((ratio < 1 - clip_low) & (adv < 0)).float()
        high = ((ratio > 1 + clip_high) & (adv > 0)).float()
        metrics["policy/clip_frac_low"] = masked_mean(low, mask)
        metrics["policy/clip_frac_high"] = masked_mean(high, mask)
        if dual_clip > 0:
            metrics["policy/dual_clip_frac"] = masked_mean(((ratio > dual_clip) & (adv < 0)).float(), mask)
        # against the behaviour policy: under truncated IS the clipped ratio is 1 by construction, and what the
        # weights correct (the learner's distance from the tokens' sampler) is the number to watch
        behaviour = (logp - old_logp) * mask
        metrics.update(_ratio_metrics(torch.exp(behaviour), behaviour, mask))
    return loss, metrics


GSPO_KNOBS = PolicyLossKnobs(clip_low=3e-4, clip_high=4e-4)  # the paper's clip range (conf/algorithm/gspo.yaml)


@register_policy_loss("gspo")
def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg: Callable[..., torch.Tensor],
    knobs: PolicyLossKnobs = GSPO_KNOBS,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071, eq. 5-7 and the token form GSPO-token, eq. 13-14).

    Sequence ratio s_i = exp(mean_t log(pi/pi_old)) (length-normalised), clipped at [1 - clip_low, 1 + clip_high]:
    per token -min(s_it A_i, clip(s_it) A_i) with s_it = sg[s_i] * pi_t / sg[pi_t], whose value is s_i and whose
    gradient is the paper's. With `seq_mean_token_mean` aggregation this equals the paper's objective exactly.
    Deliberate deviation (as verl): log s_it is clamped at 10 for numerical safety. Truncated IS does not apply
    (the ratio is already sequence-level); skip_threshold does. logp, old_logp, mask: [B, T]; advantages: [B].
    """
    clip_low, clip_high = knobs.clip_low, knobs.clip_high
    _, weight, metrics = importance_terms(logp, old_logp, advantages, mask, knobs, tis=False)
    token_log_ratio = (logp - old_logp) * mask  # [B, T]
    seq_log_ratio = token_log_ratio.sum(1) / mask.sum(1).clamp(min=1)  # [B]
    log_s = torch.clamp(logp - logp.detach() + seq_log_ratio.detach().unsqueeze(1), max=10.0)  # [B, T]
    s = torch.exp(log_s)
    adv = per_token_advantages(advantages)  # [B, 1] or [B, T]
    per_token = torch.maximum(-s * adv, -torch.clamp(s, 1 - clip_low, 1 + clip_high) * adv)
    loss = agg(per_token * weight, mask)
    with torch.no_grad():
        seq_ratio = torch.exp(seq_log_ratio).unsqueeze(1).expand_as(mask)  # [B, T]
        metrics["policy/clip_frac_low"] = masked_mean(((seq_ratio < 1 - clip_low) & (adv < 0)).float(), mask)
        metrics["policy/clip_frac_high"] = masked_mean(((seq_ratio > 1 + clip_high) & (adv > 0)).float(), mask)
        metrics.update(_ratio_metrics(torch.exp(token_log_ratio), token_log_ratio, mask))
        metrics["policy/seq_ratio_mean"] = torch.exp(seq_log_ratio).mean() if seq_log_ratio.numel() else 1.0
    return loss, metrics


@register_policy_loss("cispo")
def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg: Callable[..., torch.Tensor],
    knobs: PolicyLossKnobs = DEFAULT_KNOBS,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax 2025, "MiniMax-M1", arXiv 2506.13585, eq. 4-5): per token -sg(clip(r, 1-eL, 1+eH)) A log pi.

    Clips the importance weight instead of the update, so clipped tokens still get a (bounded) gradient.
    The paper sets no lower bound (eL large); here both bounds are knobs. logp, old_logp, mask: [B, T]; A: [B].
    """
    clip_low, clip_high = knobs.clip_low, knobs.clip_high
    _, weight, metrics = importance_terms(logp, old_logp, advantages, mask, knobs, tis=False)
    log_ratio = (logp - old_logp) * mask
    ratio = torch.exp(log_ratio)  # [B, T]
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high).detach()
    adv = per_token_advantages(advantages)  # [B, 1] or [B, T]
    per_token = -clipped * adv * logp
    loss = agg(per_token * weight, mask)
    with torch.no_grad():
        metrics["policy/clip_frac_low"] = masked_mean((ratio < 1 - clip_low).float(), mask)
        metrics["policy/clip_frac_high"] = masked_mean((ratio > 1 + clip_high).float(), mask)
        metrics.update(_ratio_metrics(ratio, log_ratio, mask))
    return loss, metrics
