"""The per-token terms beside the policy loss: the KL to the reference policy (in the loss or folded into the
reward), the sampled reverse KL to a teacher (algorithm=distill), and the entropy (metric and optional bonus).

Apart from the losses because their callers differ: the learner adds the KL and entropy to whatever loss is
registered, and the batch preparation (rl/loop/prepare.py) computes the reward-side KLs before any loss runs.
"""

from __future__ import annotations

import torch

from rl.algorithms.aggregation import masked_mean
from rl.algorithms.registry import Metrics


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
