"""Advantage estimators, policy losses, loss aggregations and KL terms, registered by name.

Algorithms are YAML bundles (`conf/algorithm/*.yaml`) that pick entries of three registries by name
(`algorithm.advantage`, `algorithm.policy_loss`, `algorithm.loss_agg`); nothing in the code branches on the
algorithm's name. One module per job, each with its calling convention at its top:
- advantages.py: estimators, `fn(rewards [B*G], group_size, *, knobs, lengths) -> [B*G]`;
- losses.py: policy losses, `fn(logp, old_logp, advantages, mask, *, agg, knobs) -> (loss, metrics)`;
- aggregation.py: per-token loss and mask to a scalar, `fn(per_token [B, T], mask [B, T], **knobs)`;
- kl.py: the KL and entropy terms beside the loss;
- registry.py: the registries and their lookups (an unknown name lists the valid ones).
An estimator or loss gets its knobs as one object, the algorithm config (`AdvantageKnobs` / `PolicyLossKnobs` in
rl/config/schema.py), and reads the fields it uses.

Pure tensor maths: no Ray, no config beyond the knobs. Every per-token tensor comes with its mask `[B, T]`
(1 = a completion token that counts). This package exports every public name of its modules, so that callers
write `from rl import algorithms` and importing it fills the registries.
"""

from rl.algorithms.advantages import (
    DEFAULT_ADVANTAGE_KNOBS,
    clip_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    pg_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rl.algorithms.aggregation import (
    agg_seq_mean_token_mean,
    agg_seq_mean_token_sum,
    agg_seq_mean_token_sum_norm,
    agg_token_mean,
    masked_mean,
)
from rl.algorithms.kl import distill_reverse_kl, kl_penalty, token_entropy
from rl.algorithms.losses import (
    DEFAULT_KNOBS,
    GSPO_KNOBS,
    cispo_loss,
    clipped_surrogate_loss,
    gspo_loss,
    importance_terms,
    per_token_advantages,
    pg_loss,
    sft_loss,
)
from rl.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    Metrics,
    get_advantage,
    get_loss_agg,
    get_policy_loss,
    register_advantage,
    register_loss_agg,
    register_policy_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DEFAULT_ADVANTAGE_KNOBS",
    "DEFAULT_KNOBS",
    "GSPO_KNOBS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "Metrics",
    "agg_seq_mean_token_mean",
    "agg_seq_mean_token_sum",
    "agg_seq_mean_token_sum_norm",
    "agg_token_mean",
    "cispo_loss",
    "clip_advantages",
    "clipped_surrogate_loss",
    "distill_reverse_kl",
    "dr_grpo_advantages",
    "get_advantage",
    "get_loss_agg",
    "get_policy_loss",
    "gspo_loss",
    "grpo_advantages",
    "importance_terms",
    "kl_penalty",
    "masked_mean",
    "per_token_advantages",
    "pg_advantages",
    "pg_loss",
    "register_advantage",
    "register_loss_agg",
    "register_policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "sft_loss",
    "token_entropy",
]
