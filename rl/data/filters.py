"""Sample filters and reward shaping between scoring and learning: pure functions over plain lists and tensors.

Each function says what it keeps or shapes, the paper and equation where it follows one, and why. No Ray, no
config objects. Each step calls them in this order: the sampler (rl/loop/sampler.py) keep_groups_in_range (dynamic
sampling, per batch of groups, on the raw rewards), then rl/loop/prepare.py overlong_penalty (reward shaping) ->
truncated_mask (loss mask) -> advantages -> top_k_per_group (which samples reach the learner).
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13), added to the task reward. lengths: [N] -> [N].

    With L_max = max_new_tokens and L_cache = buffer: 0 for |y| <= L_max - L_cache, a linear ramp
    (L_max - L_cache - |y|) / L_cache down to -1 at |y| = L_max, and -1 beyond. `factor` scales it (verl's
    penalty_factor; 1 in the paper). It depends on the length alone, as in the paper: a response that stopped
    inside the buffer is penalised too, not only one cut at L_max.
    """
    if not 0 < buffer <= max_new_tokens:
        raise ValueError(f"overlong buffer must be in (0, max_new_tokens={max_new_tokens}] (got {buffer})")
    expected = max_new_tokens - buffer
    ramp = (expected - lengths.float()) / buffer  # [N]
    return factor * torch.clamp(torch.where(lengths.float() > expected, ramp, torch.zeros_like(ramp)), min=-1.0)


def default_overlong_buffer(max_new_tokens: int) -> int:
    """L_cache = min(1024, max_new_tokens / 4) (DAPO used 4096 of 20480, a fifth; a quarter suits short budgets)."""
    return max(1, min(1024, max_new_tokens // 4))


def keep_groups_in_range(rewards: torch.Tensor, group_size: int, low: float, high: float) -> torch.Tensor:
    """Dynamic sampling (DAPO, Yu et al. 2025, eq. 11): keep prompts whose group accuracy lies in [low, high].

    rewards: [B*G] (correct = 1, wrong = 0; for other reward scales choose the range in reward units). Returns a
    [B] bool mask of groups to keep. With [0.01, 0.99] this drops exactly the all-correct and all-wrong groups
    for G < 100, i.e. the groups whose GRPO advantages are all zero. The sampler does not train on the smaller
    batch that is left: it generates more groups until the batch is full (see `sample_utilization`), so every step
    trains on the same number of groups.
    """
    accuracy = rewards.float().view(-1, group_size).mean(dim=1)  # [B]
    return (accuracy >= low) & (accuracy <= high)


def truncated_mask(finish_reasons: list[str]) -> list[bool]:
    """Overlong filtering (DAPO, Yu et al. 2025, section 3.4): True = keep in the loss; a response cut by
    max_new_tokens (finish reason "length") is masked out of the loss. Its reward still counts in its group's
    statistics (it was sampled, so the group's baseline includes it)."""
    return [reason != "length" for reason in finish_reasons]


def top_k_per_group(rewards: torch.Tensor, group_size: int, k: int) -> torch.Tensor:
    """Top-k candidate selection per prompt: indices [B*k] into the flat [B*G] batch of the k
    highest-reward completions of each prompt, ties broken by sampling order, groups in order.

    Statistics are computed BEFORE selection: the driver computes advantages over all G completions, then keeps
    these k for the learner, so the baseline is the full group's and the advantages of the kept samples do not
    change when k changes (after-selection statistics of the k best would be mostly zero).
    """
    if not 1 <= k <= group_size:
        raise ValueError(f"top_k must be in [1, group_size={group_size}] (got {k})")
    grouped = rewards.float().view(-1, group_size)  # [B, G]
    # stable descending sort: equal rewards keep their sampling order
    order = torch.sort(grouped, dim=1, descending=True, stable=True).indices[:, :k]  # [B, k]
    offsets = torch.arange(grouped.shape[0]).unsqueeze(1) * group_size  # [B, 1]
    return (order + offsets).reshape(-1)


def sample_utilization(kept_groups: int, generated_groups: int) -> float:
    """Fraction of generated prompt groups that reached the learner (1.0 without dynamic sampling)."""
    return kept_groups / generated_groups if generated_groups else 0.0
