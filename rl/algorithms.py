"""Advantage estimators, policy losses, KL estimators and loss aggregation, registered by name.

Pure tensor maths: no Ray, no config objects. Every per-token tensor comes with its mask `[B, T]`
(1 = a completion token that counts). Algorithms are YAML bundles (`conf/algorithm/*.yaml`) that pick entries of
these registries by name; nothing in the code branches on the algorithm's name.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Metrics = dict[str, float]

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


@register_advantage("grpo")
def grpo_advantages(
    rewards: torch.Tensor, group_size: int, *, std_normalize: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, section 4.1.2): A_i = (r_i - mean(r)) / std(r).

    rewards: [B*G] ordered group by group (the G completions of a prompt are adjacent). Returns [B*G].
    The std is the unbiased sample std (torch.std, as in the paper's reference and TRL); a uniform group gives 0.
    """
    grouped = rewards.view(-1, group_size)  # [B, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if std_normalize:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


# ----------------------------------------------------------------------------------------------- aggregation


@register_loss_agg("token_mean")
def agg_token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over every unmasked token of the batch (DAPO, Yu et al. 2025, eq. 8). per_token, mask: [B, T]."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


agg_token_mean.unit = "token"  # the learner weights micro-batches by their share of tokens


@register_loss_agg("seq_mean_token_mean")
def agg_seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean (GRPO, Shao et al. 2024, eq. 3). [B, T] -> scalar."""
    per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [B]
    return per_seq.mean()


agg_seq_mean_token_mean.unit = "seq"  # the learner weights micro-batches by their share of sequences


# ----------------------------------------------------------------------------------------------- KL


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


# ----------------------------------------------------------------------------------------------- losses


@register_policy_loss("clipped")
def clipped_surrogate_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with separate low/high clips (DAPO clip-higher, eq. 10).

    logp, old_logp, mask: [B, T]; advantages: [B] (broadcast over tokens). old_logp are the behaviour logprobs
    returned by the rollout engine, so the ratio also corrects for the train-inference mismatch.
    """
    log_ratio = (logp - old_logp) * mask
    ratio = torch.exp(log_ratio)  # [B, T]
    adv = advantages.unsqueeze(1)  # [B, 1]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = agg(per_token, mask)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        low = ((ratio < 1 - clip_low) & (adv < 0)).float()
        high = ((ratio > 1 + clip_high) & (adv > 0)).float()
        metrics = {
            "policy/clip_frac_low": float((low * mask).sum() / n),
            "policy/clip_frac_high": float((high * mask).sum() / n),
            "policy/ratio_mean": float((ratio * mask).sum() / n),
            "policy/ratio_max": float(ratio.masked_fill(mask == 0, float("-inf")).max()) if mask.any() else 1.0,
            # KL(pi_old || pi) by k3 on tokens sampled from pi_old: (r - 1) - log r
            "policy/approx_kl": float(((ratio - 1 - log_ratio) * mask).sum() / n),
        }
    return loss, metrics
