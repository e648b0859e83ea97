"""From a scored batch to the learner's samples: reward shaping -> advantages -> loss masks -> top-k.

Functions over plain data (no Ray) that read their knobs from the resolved `algorithm` group (and the completion
budget, the schema's completion_tokens), where they are declared once. The advantage estimator gets the algorithm
config as its knobs and reads those it uses (rl/algorithms/advantages.py). `algorithm.kl_in_reward` needs the
reference logprobs, which the learner computes: the driver passes a function that returns them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from rl import algorithms
from rl.config.schema import AlgorithmConfig
from rl.data import filters
from rl.types import Completion, PromptRollout, TrainSample, completions_of

RefLogprobs = Callable[[list[PromptRollout]], list[list[float]]]  # also the teacher's (Runtime.teacher_logprobs)


def prepare_samples(
    rollouts: list[PromptRollout],
    rewards: list[float],
    a: AlgorithmConfig,
    completion_tokens: int,
    token_advantages: list[list[float]] | None = None,
) -> tuple[list[TrainSample], torch.Tensor, dict]:
    """The learner's samples, the advantages [B*G] (before top-k), and metrics. `rewards` are after any KL-in-reward
    penalty (`kl_reward_penalty`); the overlong penalty is added here (`completion_tokens`: the completion budget).
    `token_advantages` (one list per completion, `distill_advantages`) ride along, added to each sample's advantage
    token by token."""
    completions = completions_of(rollouts)
    lengths = torch.tensor([c.model_tokens for c in completions], dtype=torch.float32)  # [B*G], loss tokens
    shaped, metrics = shape_rewards(rewards, lengths, a, completion_tokens)
    in_loss = (
        filters.truncated_mask([c.finish_reason for c in completions])
        if a.filter_truncated_response
        else [True] * len(completions)
    )
    estimator = algorithms.get_advantage(a.advantage)
    adv = estimator(shaped, a.group_size, knobs=a, lengths=lengths * torch.tensor(in_loss, dtype=torch.float32))
    samples = [
        TrainSample(
            r.prompt_ids,
            c.token_ids,
            c.logprobs,
            float(adv[k]),
            loss_mask(c, in_loss[k]),
            token_advantages[k] if token_advantages is not None else [],
        )
        for k, (r, c) in enumerate((r, c) for r in rollouts for c in r.completions)
    ]
    metrics["response/masked_truncated_frac"] = 1.0 - sum(in_loss) / max(len(in_loss), 1)
    if a.top_k is not None:  # resolved: None when it would keep the whole group
        samples = [samples[i] for i in filters.top_k_per_group(shaped, a.group_size, a.top_k).tolist()]
    metrics["train/samples"] = float(len(samples))
    return samples, adv, metrics


def loss_mask(c: Completion, in_loss: bool) -> list[int]:
    """A completion's loss mask: empty (every token) for a single turn, the model tokens of an episode (its env
    tokens are context only), all zeros when it is filtered out of the loss."""
    if not in_loss:
        return [0] * len(c.token_ids)
    return list(c.mask) if c.mask is not None else []


def shape_rewards(
    rewards: list[float], lengths: torch.Tensor, a: AlgorithmConfig, completion_tokens: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """The rewards the advantages are computed from [B*G]: weighted by algorithm.task_reward_coef (0 with
    algorithm=distill: the teacher's per-token term is the whole signal), with DAPO's soft overlong punishment
    (eq. 13) added when algorithm.overlong_penalty is on (the resolve step leaves algorithm.overlong_buffer None
    when it is off). `completion_tokens`: the completion budget the overlong penalty counts from."""
    shaped = a.task_reward_coef * torch.tensor(rewards, dtype=torch.float32)  # [B*G]
    if a.overlong_buffer is None:
        return shaped, {}
    penalty = filters.overlong_penalty(lengths, completion_tokens, a.overlong_buffer, a.overlong_penalty_factor)
    return shaped + penalty, {"reward/overlong_penalty_mean": float(penalty.mean())}


def kl_reward_penalty(
    ref_logprobs: RefLogprobs, rollouts: list[PromptRollout], rewards: list[float], a: AlgorithmConfig
) -> tuple[list[float], dict[str, float]]:
    """KL folded into the reward (InstructGPT, Ouyang et al. 2022, eq. 2; REINFORCE++): each completion's reward
    becomes r - kl_coef * sum_t kl_t, with kl_t estimated on the sampled tokens from the behaviour logprobs and
    the reference policy (the learner with its adapter disabled). The advantages are then computed on that.
    Without algorithm.kl_in_reward (`reward_kl_coef` 0) the rewards pass through unchanged."""
    coef, estimator = a.reward_kl_coef, a.kl_estimator.value
    if not coef:
        return rewards, {}
    ref = ref_logprobs(rollouts)
    completions = completions_of(rollouts)
    per_seq = [  # over the model's tokens: an episode's env tokens have no behaviour logprob
        float((algorithms.kl_penalty(torch.tensor(c.logprobs), torch.tensor(q), estimator) * model_mask(c)).sum())
        for c, q in zip(completions, ref)
    ]
    shaped = [r - coef * k for r, k in zip(rewards, per_seq)]
    return shaped, {
        "reward/kl_penalty_mean": coef * float(np.mean(per_seq)),
        "policy/kl_ref_seq": float(np.mean(per_seq)),
    }


def distill_advantages(
    teacher_logprobs: RefLogprobs, rollouts: list[PromptRollout], a: AlgorithmConfig
) -> tuple[list[list[float]] | None, dict[str, float]]:
    """On-policy distillation (algorithm=distill): each sampled token's advantage gains
    -distill_coef * (log pi(y_t) - log pi_T(y_t)), minus the sampled reverse KL to the teacher at that token
    (rl/algorithms/kl.py distill_reverse_kl), with the behaviour logprobs as the student's and the judge/teacher
    engines' logprobs of the same token ids as the teacher's; 0 on environment tokens. The term is per token and
    undiscounted (each token answers for its own KL, not the rest of the sequence's): lower variance than the
    sequence's sum as a reward, and what makes a few steps enough. None (and no metrics) without
    algorithm.distill_coef. Metrics: `distill/kl_per_token` (the teacher-student KL of the step's samples, nats
    per token), `distill/kl_seq` (per completion), `time/teacher_s`."""
    coef = a.distill_coef
    if not coef:
        return None, {}
    t0 = time.perf_counter()
    teacher = teacher_logprobs(rollouts)
    seconds = time.perf_counter() - t0
    completions = completions_of(rollouts)
    width = max((len(c.token_ids) for c in completions), default=0)

    def padded(rows: list[list[float]]) -> torch.Tensor:
        return torch.tensor([list(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32)  # [B*G, T]

    student, theirs = padded([c.logprobs for c in completions]), padded(teacher)
    mask = padded([model_mask(c).tolist() for c in completions])
    per_seq, metrics = algorithms.distill_reverse_kl(student, theirs, mask)
    per_token = -coef * (student - theirs) * mask  # [B*G, T]
    token_adv = [per_token[k, : len(c.token_ids)].tolist() for k, c in enumerate(completions)]
    return token_adv, {
        "distill/kl_per_token": float(metrics["distill/kl_per_token"]),
        "distill/kl_seq": float(per_seq.mean()) if per_seq.numel() else 0.0,
        "time/teacher_s": seconds,
    }


def model_mask(c: Completion) -> torch.Tensor:
    """1.0 on the model's tokens of a completion, 0.0 on environment tokens [T]."""
    return torch.ones(len(c.token_ids)) if c.mask is None else torch.tensor(c.mask, dtype=torch.float32)


def rollout_metrics(
    rollouts: list[PromptRollout], rewards: list[float], adv: torch.Tensor, group_size: int, threshold: float = 1.0
) -> dict:
    completions = completions_of(rollouts)
    lengths = [c.model_tokens for c in completions]
    truncated = [c.finish_reason == "length" for c in completions]
    rw = torch.tensor(rewards).view(-1, group_size)
    return {
        "reward/mean": float(rw.mean()),
        "reward/std": float(rw.std()) if rw.numel() > 1 else 0.0,
        "reward/group_best_mean": float(rw.max(dim=1).values.mean()),
        "response/length_mean": float(np.mean(lengths)),
        "response/length_max": float(max(lengths)),
        "response/truncated_frac": float(np.mean(truncated)),
        "adv/mean": float(adv.mean()),
        "adv/std": float(adv.std()) if adv.numel() > 1 else 0.0,
        "adv/zero_group_frac": float((rw.std(dim=1) == 0).float().mean()),
    } | episode_metrics(completions, rewards, threshold)


def episode_metrics(
    completions: list[Completion], rewards: list[float] | None = None, threshold: float = 1.0
) -> dict[str, float]:
    """Multi-turn episodes (none: no metrics): turns, tool calls and errors and time per episode, the share of
    well-formed tool calls among those the model tried, the share of environment tokens among completion tokens,
    and the share of episodes truncated (finish_reason "length"). With `rewards` (one per completion), what shows
    the environment's answers being used: the share of episodes solved (reward >= `threshold`), the share solved
    after it answered (on the second model turn or later: after feedback or tool results), and the mean turn of
    the solved ones."""
    episodes = [c.episode for c in completions if c.episode is not None]
    if not episodes:
        return {}
    all_tokens = sum(len(c.token_ids) for c in completions)
    tried = sum(e.tool_calls + e.malformed_calls for e in episodes)
    outcome = {}
    if rewards is not None:
        solved = [c.episode.turns for c, r in zip(completions, rewards) if r >= threshold and c.episode]
        outcome = {
            "env/solved_frac": len(solved) / len(episodes),
            "env/solved_after_feedback_frac": sum(t >= 2 for t in solved) / len(episodes),
            "env/solved_turn_mean": float(np.mean(solved)) if solved else 0.0,
        }
    # a share of no tool call is no number: the key is left out when none was tried
    wellformed = {"env/tool_calls_wellformed_frac": sum(e.tool_calls for e in episodes) / tried} if tried else {}
    return (
        outcome
        | wellformed
        | {
            "env/turns_mean": float(np.mean([e.turns for e in episodes])),
            "env/turns_max": float(max(e.turns for e in episodes)),
            "env/tool_calls_per_episode": float(np.mean([e.tool_calls for e in episodes])),
            "env/tool_errors_per_episode": float(np.mean([e.tool_errors for e in episodes])),
            "env/reward_errors": float(sum(e.reward_errors for e in episodes)),
            "env/tool_s": float(sum(e.tool_seconds for e in episodes)),
            "env/env_token_frac": sum(e.env_tokens for e in episodes) / max(all_tokens, 1),
            "env/truncated_frac": float(np.mean([c.finish_reason == "length" for c in completions])),
            "env/episode_length_mean": float(np.mean([len(c.token_ids) for c in completions])),
        }
        | {
            f"env/term/{name}": float(np.mean([e.terms.get(name, 0.0) for e in episodes]))
            for name in sorted({n for e in episodes for n in e.terms})
        }
    )
