"""Loss aggregations: a per-token loss [B, T] and its mask to the scalar the learner backpropagates, registered by
name (`algorithm.loss_agg`), and the masked mean the losses' metrics use.

Called as `fn(per_token [B, T], mask [B, T], **knobs) -> scalar` (the learner binds `norm_length`). Each has a
`unit` attribute that tells the learner how to weight micro-batches so that gradient accumulation is exact:
"token" by their share of unmasked tokens, "seq" by their share of sequences with at least one unmasked token
(fully masked sequences, e.g. truncated responses under algorithm.filter_truncated_response, are excluded from the
sequence count, as in verl).
"""

from __future__ import annotations

import torch

from rl.algorithms.registry import register_loss_agg


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask (0 when the mask is empty), as a detached 0-d tensor: no device sync."""
    return ((x * mask).sum() / mask.sum().clamp(min=1)).detach()


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
