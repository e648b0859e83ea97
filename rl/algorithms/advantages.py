"""Advantage estimators: one scalar per completion from its outcome reward, broadcast by the learner to every
completion token. Each is registered by name (`algorithm.advantage`) and called the same way:

    fn(rewards [B*G], group_size, *, knobs: AdvantageKnobs, lengths: [B*G] | None) -> [B*G]

`rewards` and `lengths` (each completion's loss tokens) are data; `group_size` says how the rewards split into
prompt groups (the G completions of a prompt are adjacent). `knobs` is the algorithm config, an `AdvantageKnobs`
(rl/config/schema.py), of which each estimator reads the fields it uses; the call site never picks them, so a new
knob is a field there and its use here. Every estimator ends with `clip_advantages` (algorithm.adv_clip).
"""

from __future__ import annotations

import torch

from rl.algorithms.registry import register_advantage
from rl.config.choices import PgBaseline
from rl.config.schema import AdvantageKnobs

DEFAULT_ADVANTAGE_KNOBS = AdvantageKnobs()


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.float().view(-1, group_size)  # [B, G]


def clip_advantages(adv: torch.Tensor, knobs: AdvantageKnobs) -> torch.Tensor:
    """Each advantage clipped to [-adv_clip, adv_clip] (adv_clip 0: unchanged). [B*G] -> [B*G].

    Bounds the weight of one completion in the update whatever the estimator's scale: a group whose rewards
    nearly tie gives GRPO advantages up to (G-1)/sqrt(G) in magnitude, and unnormalised rewards (pg) any size.
    """
    return adv.clamp(-knobs.adv_clip, knobs.adv_clip) if knobs.adv_clip > 0 else adv


@register_advantage("grpo")
def grpo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    knobs: AdvantageKnobs = DEFAULT_ADVANTAGE_KNOBS,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, section 4.1.2): A_i = (r_i - mean(r)) / (std(r) + eps).

    rewards: [B*G] ordered group by group. Returns [B*G]. Knobs: std_unbiased, the sample std (n-1, torch.std; as
    in the paper's reference code, TRL and verl) or population std (n); std_normalize=False gives Dr.GRPO's
    centring only; eps = adv_eps. A uniform group gives exactly 0. `lengths` is not read.
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if knobs.std_normalize:
        std = grouped.std(dim=1, keepdim=True, correction=1 if knobs.std_unbiased else 0)
        centred = centred / (std + knobs.adv_eps)
    return clip_advantages(centred.reshape(-1), knobs)


@register_advantage("dr_grpo")
def dr_grpo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    knobs: AdvantageKnobs = DEFAULT_ADVANTAGE_KNOBS,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", eq. 3 / Appendix A): A_i = r_i - mean(r).

    No division by the group std (which up-weights too easy / too hard prompts). [B*G] -> [B*G].
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    return clip_advantages((grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1), knobs)


@register_advantage("rloo")
def rloo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    knobs: AdvantageKnobs = DEFAULT_ADVANTAGE_KNOBS,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics", eq. 6): A_i = r_i - mean_{j != i} r_j.

    Computed as G / (G - 1) * (r_i - mean(r)), which is the same quantity. [B*G] -> [B*G]; needs G >= 2.
    """
    if group_size < 2:
        raise ValueError("rloo needs group_size >= 2 (the leave-one-out baseline of a single sample is undefined)")
    grouped = _grouped(rewards, group_size)  # [B, G]
    adv = (grouped - grouped.mean(dim=1, keepdim=True)) * group_size / (group_size - 1)
    return clip_advantages(adv.reshape(-1), knobs)


@register_advantage("pg")
def pg_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    knobs: AdvantageKnobs = DEFAULT_ADVANTAGE_KNOBS,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE returns (Williams 1992, eq. 11, baseline b): A_i = r_i - b.

    knobs.pg_baseline: "none" (b = 0, the plain estimator) or "group_mean" (b = mean of the prompt's G rewards;
    this includes r_i itself, so it is slightly biased by a factor (G-1)/G, unlike rloo). [B*G] -> [B*G].
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    if knobs.pg_baseline == PgBaseline.none:
        return clip_advantages(grouped.reshape(-1).clone(), knobs)
    if knobs.pg_baseline == PgBaseline.group_mean:
        return clip_advantages((grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1), knobs)
    valid = ", ".join(b.value for b in PgBaseline)
    raise KeyError(f"algorithm.pg_baseline={knobs.pg_baseline!r} is not known; valid names: {valid}")


@register_advantage("reinforce_pp")
def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    knobs: AdvantageKnobs = DEFAULT_ADVANTAGE_KNOBS,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262, section 3, "REINFORCE++-Baseline"):
    A'_i = r_i - mean_group(r), then whitened over the batch: A_i = (A'_i - mean(A')) / sqrt(var(A') + eps).

    It divides by the batch std; eps = adv_eps. rewards: [B*G]; returns [B*G].
    lengths: [B*G] completion token counts. When given, the batch statistics are over tokens (each completion
    weighted by its length, unbiased variance over tokens), which is what the paper's token-level formulation and
    verl compute; when None, over completions. Deviation: the paper also folds a k1 KL into the token rewards;
    here KL is a separate loss term (algorithm.kl_coef), or folded into the reward by algorithm.kl_in_reward.
    """
    grouped = _grouped(rewards, group_size)  # [B, G]
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)  # [B*G]
    w = torch.ones_like(centred) if lengths is None else lengths.to(centred.dtype)  # [B*G]
    n = w.sum()
    if n <= 1:
        return clip_advantages(centred - centred.mean() if n == 1 else centred, knobs)
    mean = (centred * w).sum() / n
    var = ((centred - mean).pow(2) * w).sum() / (n - 1)
    return clip_advantages((centred - mean) * torch.rsqrt(var + knobs.adv_eps), knobs)
