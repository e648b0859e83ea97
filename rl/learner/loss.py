"""One micro-batch's loss and its weight in the step, shared by the learner's step (learner.py) and a sweep pack's
grouped step over several jobs (grouped.py), so that a packed job's loss is its solo step's by construction."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl import algorithms
from rl.config.schema import AlgorithmConfig
from rl.learner.batching import loss_tokens
from rl.types import TrainSample


def entropy_use(a: AlgorithmConfig) -> str:
    """The token entropy a step computes: with its gradient for an entropy bonus, else a metric from the same
    logsumexp."""
    return "loss" if a.entropy_coef > 0 else "metric"


def micro_batch_loss(
    a: AlgorithmConfig,
    loss_fn: Callable,
    agg_fn: Callable,
    logp: torch.Tensor,
    entropy: torch.Tensor | None,
    ref: torch.Tensor | None,
    mask: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A micro-batch's loss under the `algorithm` group `a`, whose policy loss and aggregation are `loss_fn` and
    `agg_fn`: the policy loss, minus the entropy bonus, plus the KL to the reference (`ref`: the reference's
    logprobs, given when `a.loss_kl_coef` > 0); and the micro-batch's policy metrics. Tensors [B, C] (adv [B] or
    [B, C]), completion-aligned with their mask."""
    loss, metrics = loss_fn(logp, old, adv, mask, agg=agg_fn, knobs=a)
    if a.entropy_coef > 0:  # entropy bonus: maximise the aggregated token entropy
        loss = loss - a.entropy_coef * agg_fn(entropy, mask)
    if ref is not None:
        kl = algorithms.kl_penalty(logp, ref, a.kl_estimator.value)
        loss = loss + a.loss_kl_coef * agg_fn(kl, mask)  # loss_kl_coef: 0 when the KL is folded into the reward
        metrics["policy/kl_ref"] = algorithms.masked_mean(kl, mask)
    with torch.no_grad():
        metrics["policy/neg_logp"] = algorithms.masked_mean(-logp, mask)  # mean -log p of sampled tokens
        if entropy is not None:
            metrics["policy/entropy"] = algorithms.masked_mean(entropy, mask)
        metrics["policy/train_infer_logp_diff"] = algorithms.masked_mean((logp - old).abs(), mask)
    return loss, metrics


def micro_batch_weight(mb: list[TrainSample], n_seq: int, n_tok: int, unit: str) -> float:
    """A micro-batch's share of the unit its aggregation averages over ("token" or "seq"), counted on the host."""
    return loss_tokens(mb) / max(n_tok, 1) if unit == "token" else len(mb) / max(n_seq, 1)
