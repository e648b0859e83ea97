"""Advantage estimators, policy losses, KL estimators and loss aggregation, registered by name.

One module on purpose (as verl's core_algos.py): every entry is short, and the reader compares the algorithms
side by side, against the papers each docstring names; that is why it is past 400 lines.

Pure tensor maths: no Ray, no config objects. Every per-token tensor comes with its mask `[B, T]`
(1 = a completion token that counts). Algorithms are YAML bundles (`conf/algorithm/*.yaml`) that pick entries of
these registries by name; nothing in the code branches on the algorithm's name.

Calling conventions (the caller passes one set of knobs to any entry):
- advantage estimator: `fn(rewards [B*G], group_size, **knobs) -> [B*G]`; knobs an estimator does not use are
  ignored (`**_`), so `algorithm.advantage=X` is the only thing that changes between estimators.
- policy loss: `fn(logp, old_logp, advantages, mask, *, agg, knobs) -> (loss, metrics)`; advantages [B], or
  [B, T] when samples carry per-token terms (`per_token_advantages` broadcasts either); `old_logp` are the
  behaviour logprobs returned by the rollout engine; `knobs` is the algorithm's `PolicyLossKnobs` (rl/config/schema.py),
  of which each loss reads the fields it uses. Shared knobs: `tis_cap`, `skip_threshold` (see `importance_terms`).
  A new knob is a field of PolicyLossKnobs, its value in a conf/algorithm/ bundle, and its use here.
- aggregation: `fn(per_token [B, T], mask [B, T], **knobs) -> scalar`, with a `unit` attribute ("token" or
  "seq") that tells the learner how to weight micro-batches so that gradient accumulation is exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rl.config.schema import PolicyLossKnobs

DEFAULT_KNOBS = PolicyLossKnobs()
# Metric values are floats or 0-d tensors: a loss returns tensors so that computing them never waits for the device
# (on a GPU a float() between forward and backward stalls the launch queue); the learner converts them once per step
Metrics = dict[str, "float | torch.Tensor"]

ADVANTAGE_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {}
POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, Metrics]]] = {}
LOSS_AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {}


def _register(registry: dict, kind: str, name: str):
    def deco(fn):
        if name in registry:
            raise ValueError(f"{kind} {name!r} is registered twice ({registry[name].__module__} and {fn.__module__})")
        registry[name] = fn
        return fn

    return deco


def register_advantage(name: str):
    return _register(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def register_policy_loss(name: str):
    return _register(POLICY_LOSSES, "policy loss", name)


def register_loss_agg(name: str):
    return _register(LOSS_AGGREGATIONS, "loss aggregation", name)


def _lookup(registry: dict, kind: str, key: str, name: str):
    try:
        return registry[name]
    except KeyError:
        raise KeyError(f"{key}={name!r} is not a known {kind}; valid names: {', '.join(sorted(registry))}") from None


def get_advantage(name: str):
    return _lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", "algorithm.advantage", name)


def get_policy_loss(name: str):
    return _lookup(POLICY_LOSSES, "policy loss", "algorithm.policy_loss", name)


def get_loss_agg(name: str):
    return _lookup(LOSS_AGGREGATIONS, "loss aggregation", "algorithm.loss_agg", name)


# ----------------------------------------------------------------------------------------------- advantages
# Outcome rewards only: one scalar per completion, broadcast by the learner to every completion token.


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.float().view(-1, group_size)  # [B, G]


@register_advantage("grpo")
def grpo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    std_normalize: bool = True,
    std_unbiased: bool = True,
    eps: float = 1e-6,
    **_,
) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, section 4.1.2): A_i = (r_i - mean(r)) / (std(r) + eps).

    rewards: [B*G] ordered group by group (the G completions of a prompt are adjacent). Returns [B*G].
    std_unbiased: sample std (n-1, torch.std; as in the paper's reference code, TRL and verl) or population std (n).
    std_normalize=False gives Dr.GRPO's centring only. A uniform group gives exactly 0.
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if std_normalize:
        centred = centred / (grouped.std(dim=1, keepdim=True, correction=1 if std_unbiased else 0) + eps)
    return centred.reshape(-1)


@register_advantage("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, group_size: int, **_) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", eq. 3 / Appendix A): A_i = r_i - mean(r).

    No division by the group std (which up-weights too easy / too hard prompts). [B*G] -> [B*G].
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)


@register_advantage("rloo")
def rloo_advantages(rewards: torch.Tensor, group_size: int, **_) -> torch.Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics", eq. 6): A_i = r_i - mean_{j != i} r_j.

    Computed as G / (G - 1) * (r_i - mean(r)), which is the same quantity. [B*G] -> [B*G]; needs G >= 2.
    """
    if group_size < 2:
        raise ValueError("rloo needs group_size >= 2 (the leave-one-out baseline of a single sample is undefined)")
    grouped = _grouped(rewards, group_size)  # [B, G]
    return ((grouped - grouped.mean(dim=1, keepdim=True)) * group_size / (group_size - 1)).reshape(-1)


@register_advantage("pg")
def pg_advantages(rewards: torch.Tensor, group_size: int, *, pg_baseline: str = "none", **_) -> torch.Tensor:
    """REINFORCE returns (Williams 1992, eq. 11, baseline b): A_i = r_i - b.

    pg_baseline: "none" (b = 0, the plain estimator) or "group_mean" (b = mean of the prompt's G rewards; this
    includes r_i itself, so it is slightly biased by a factor (G-1)/G, unlike rloo). [B*G] -> [B*G].
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    if pg_baseline == "none":
        return grouped.reshape(-1).clone()
    if pg_baseline == "group_mean":
        return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    raise KeyError(f"algorithm.pg_baseline={pg_baseline!r} is not known; valid names: group_mean, none")


@register_advantage("reinforce_pp")
def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    eps: float = 1e-6,
    lengths: torch.Tensor | None = None,
    **_,
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262, section 3, "REINFORCE++-Baseline"):
    A'_i = r_i - mean_group(r), then whitened over the batch: A_i = (A'_i - mean(A')) / sqrt(var(A') + eps).

    It divides by the batch std (an earlier seed multiplied by it). rewards: [B*G]; returns [B*G].
    lengths: [B*G] completion token counts. When given, the batch statistics are over tokens (each completion
    weighted by its length, unbiased variance over tokens), which is what the paper's token-level formulation and
    verl compute; when None, over completions. Deviation: the paper also folds a k1 KL into the token rewards;
    here KL is a separate loss term (algorithm.kl_coef).
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)  # [B*G]
    w = torch.ones_like(centred) if lengths is None else lengths.to(centred.dtype)  # [B*G]
    n = w.sum()
    if n <= 1:
        return centred - centred.mean() if n == 1 else centred
    mean = (centred * w).sum() / n
    var = ((centred - mean).pow(2) * w).sum() / (n - 1)
    return (centred - mean) * torch.rsqrt(var + eps)


# ----------------------------------------------------------------------------------------------- aggregation
# `unit` tells the learner how to weight micro-batches: "token" by their share of unmasked tokens, "seq" by their
# share of sequences with at least one unmasked token (fully masked sequences, e.g. truncated responses under
# algorithm.filter_truncated_response, are excluded from the sequence count, as in verl).


def _seq_mean(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    has_tokens = (mask.sum(dim=1) > 0).to(per_seq.dtype)  # [B]
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1)


@register_loss_agg("token_mean")
def agg_token_mean(per_token: torch.Tensor, mask: torch.Tensor, **_) -> torch.Tensor:
    """Mean over every unmasked token of the batch (DAPO, Yu et al. 2025, eq. 8). per_token, mask: [B, T]."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


agg_token_mean.unit = "token"


@register_loss_agg("seq_mean_token_mean")
def agg_seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, **_) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean (GRPO, Shao et al. 2024, eq. 3). [B, T] -> scalar."""
    per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [B]
    return _seq_mean(per_seq, mask)


agg_seq_mean_token_mean.unit = "seq"


@register_loss_agg("seq_mean_token_sum")
def agg_seq_mean_token_sum(per_token: torch.Tensor, mask: torch.Tensor, **_) -> torch.Tensor:
    """Mean over sequences of each sequence's token sum: the REINFORCE estimator of a sequence's log-likelihood
    gradient (Williams 1992; Ahmadian et al. 2024, eq. 4). [B, T] -> scalar."""
    return _seq_mean((per_token * mask).sum(dim=1), mask)


agg_seq_mean_token_sum.unit = "seq"


@register_loss_agg("seq_mean_token_sum_norm")
def agg_seq_mean_token_sum_norm(
    per_token: torch.Tensor, mask: torch.Tensor, *, norm_length: float = 1024.0, **_
) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025, eq. 3 / Appendix A): token sums divided by a constant, the generation budget
    `norm_length` (MAX_TOKENS), instead of each sequence's own length, then a mean over sequences. [B, T] -> scalar.

    Deviation from verl's default (which divides by the padded width of the micro-batch): a constant keeps the
    per-token weight equal across micro-batches and steps, which is the point of the method.
    """
    return agg_seq_mean_token_sum(per_token, mask) / norm_length


agg_seq_mean_token_sum_norm.unit = "seq"


# ----------------------------------------------------------------------------------------------- KL, entropy


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL divergence").

    k1 = log r', k2 = (log r')^2 / 2, k3 = exp(-log r') - 1 + log r', with log r' = logp - ref_logp. [B, T].
    """
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise KeyError(f"algorithm.kl_estimator={estimator!r} is not known; valid names: k1, k2, k3")


def distill_reverse_kl(
    logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, Metrics]:
    """Sampled reverse KL to a teacher, per sequence: sum_t (log pi(y_t) - log pi_T(y_t)) over the sampled tokens
    y ~ pi (on-policy distillation: Gu et al. 2024, MiniLLM, eq. 1, optimised by policy gradient as in its
    section 2.2; Agarwal et al. 2024, GKD, with the reverse KL as divergence). Its expectation under pi is
    KL(pi || pi_T) of the whole completion; its negative is the reward algorithm=distill maximises.

    logp: [B, T] the student's (behaviour) logprobs of its sampled tokens; teacher_logp: [B, T] the teacher's of
    the same tokens; mask: [B, T] 1 on the model's tokens. Returns ([B] per-sequence sums, metrics):
    `distill/kl_per_token`, the per-token mean over every unmasked token of the batch (the teacher-student KL)."""
    per_token = (logp - teacher_logp) * mask  # [B, T]
    per_seq = per_token.sum(dim=1)  # [B]
    return per_seq, {"distill/kl_per_token": masked_mean(logp - teacher_logp, mask)}


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the full next-token distribution, H = logsumexp(z) - sum softmax(z) z. logits [B, T, V] -> [B, T].

    Used for the `policy/entropy` metric and the optional entropy bonus (Mnih et al. 2016, A3C, section 4;
    Williams & Peng 1991). Temperature scaling, if any, is applied by the caller.
    """
    logits = logits.float()
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


# ----------------------------------------------------------------------------------------------- losses


def per_token_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages in a shape that broadcasts over tokens: one per sequence [B] -> [B, 1]; per token [B, T] (the
    sequence's advantage plus a per-token term, e.g. algorithm=distill's reverse KL) as they are."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask (0 when the mask is empty), as a detached 0-d tensor: no device sync."""
    return ((x * mask).sum() / mask.sum().clamp(min=1)).detach()


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
    skip_threshold > 0: sequences whose mean token ratio pi_learner / pi_behaviour exceeds it get weight 0 (a
      sample that far from the policy that drew it gives an importance weight that is mostly noise). They still
      count in the loss normaliser.
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
