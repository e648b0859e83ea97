"""Held-out evaluation (greedy accuracy, pass@k, per named eval set) and the per-sample jsonl files a run writes
(eval/step_N.jsonl, rollouts/step_N.jsonl).

`evaluate` takes the runtime, the resolved `eval` group and the two samplings it runs (the schema's sampling_for),
`save_rollouts` the `algorithm` group for the reward shaping it re-applies; the metrics and rows are plain functions
over plain data (no Ray, no config objects).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from rewards.protocol import RewardFn, pop_metrics
from rl.atomic import atomic_jsonl
from rl.config.run import EvalConfig
from rl.config.schema import AlgorithmConfig
from rl.data.prompts import PromptData
from rl.loop.checkpoint import step_dir_name
from rl.loop.prepare import episode_metrics, shape_rewards
from rl.loop.sampler import score
from rl.runtime.runtime import Runtime
from rl.seeds import prompt_seed
from rl.types import Completion, PromptRollout, Sampling, completions_of


def evaluate(
    runtime: Runtime,
    data: PromptData,
    reward_fn: RewardFn,
    ev: EvalConfig,
    step: int,
    *,
    greedy: Sampling,
    sampled: Sampling,
    seed: int,
    path: Path | None = None,
) -> dict[str, float]:
    """Greedy accuracy on the held-out prompts (`greedy`: the schema's sampling_for("greedy")) and, with
    eval.n_samples > 0, pass@1 and pass@k (eval.pass_k) over that many samples per prompt (`sampled`:
    sampling_for("eval"); unbiased estimator, Chen et al. 2021 eq. 1), overall and per named eval set (envs/data.py
    metadata.eval_set); a completion is correct when its reward >= eval.correct_threshold. `seed`: run.seed. Every
    completion is written to `path` (default <eval.save_dir>/step_N.jsonl)."""
    if len(data) == 0:
        return {}
    t0 = time.perf_counter()
    # greedy ignores the seeds; the sampled completions (pass@k) depend on the step and the prompt only;
    # a multi-turn env's evaluation runs its episodes (the items start them; a single-turn run does not send them)
    seeds = [prompt_seed(seed, i, "eval", step) for i in range(len(data))]
    best = runtime.generate(data.prompt_ids, greedy, items=data.items, seeds=seeds)
    runs = [("greedy", best, score(reward_fn, best, data.items))]
    n = sampled.n
    if n:
        samples = runtime.generate(data.prompt_ids, sampled, items=data.items, seeds=seeds)
        runs.append(("sampled", samples, score(reward_fn, samples, data.items)))
    out = eval_metrics(
        runs[0][2],
        [runs[1][2][i * n : (i + 1) * n] for i in range(len(data))] if n else None,
        [it.get("metadata", {}).get("eval_set") for it in data.items],
        threshold=ev.correct_threshold,
        ks=ev.pass_k,
    )
    out["eval/length_mean"] = float(np.mean([r.completions[0].model_tokens for r in best]))
    episodes = episode_metrics(completions_of(best), runs[0][2], ev.correct_threshold)
    out |= {f"eval/{k[4:]}": v for k, v in episodes.items()}
    out["eval/n"] = float(len(data))
    # the evaluation's reward errors and timeouts are its own, not the next training step's; eval/reward_errors has
    # one slash, as every overall eval metric (eval/<set>/<metric> is a named eval set's)
    out |= {f"eval/{k.replace('/', '_')}": v for k, v in pop_metrics(reward_fn).items()}
    if path is None and ev.save_dir is not None:  # resolved: <run dir>/eval unless set
        path = Path(ev.save_dir) / f"{step_dir_name(step)}.jsonl"
    if path is not None:
        with atomic_jsonl(path) as f:
            for mode, rollouts, rewards in runs:
                for row in eval_rows(step, data.items, rollouts, rewards, mode=mode, threshold=ev.correct_threshold):
                    write_row(f, row)
    out["time/eval_s"] = time.perf_counter() - t0
    return out


def save_rollouts(
    path: Path,
    step: int,
    tokenizer: Any,
    rollouts: list[PromptRollout],
    rewards: list[float],
    shaped: list[float],
    adv: torch.Tensor,
    a: AlgorithmConfig,
    completion_tokens: int,
) -> list[dict]:
    """Every completion of a training step (every logger.rollouts_interval steps) as jsonl, written atomically: task `rewards`,
    the rewards after all shaping (`shaped` is after the KL-in-reward penalty; the overlong penalty is added here,
    as prepare_samples does), the advantages [B*G]. The prompt is decoded from the token ids the model saw.
    Returns the rows written (the driver logs them to wandb as a table too)."""
    lengths = torch.tensor([c.model_tokens for c in completions_of(rollouts)], dtype=torch.float32)
    final = shape_rewards(shaped, lengths, a, completion_tokens)[0].tolist()
    prompts = [tokenizer.decode(r.prompt_ids) for r in rollouts]
    written = []
    with atomic_jsonl(path) as f:
        for row, c in zip(
            rollout_rows(step, prompts, rollouts, rewards, final, adv.tolist()), completions_of(rollouts)
        ):
            if c.mask is not None:  # a whole episode: which spans the model wrote and which the env added
                row["spans"] = [
                    {
                        "by": "model" if m else "env",
                        "tokens": end - start,
                        "text": tokenizer.decode(c.token_ids[start:end]),
                    }
                    for m, start, end in mask_spans(c.mask)
                ]
            if c.versions is not None:  # continuous rollouts: which adapter version sampled which tokens
                row["versions"] = [{"version": v, "tokens": end - start} for v, start, end in mask_spans(c.versions)]
            write_row(f, row)
            written.append(row)
    return written


def mask_spans(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values: an episode's model and environment spans, a continuous
    rollout's adapter versions."""
    out: list[tuple[int, int, int]] = []
    for i, m in enumerate(mask):
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1], i + 1)
        else:
            out.append((m, i, i + 1))
    return out


def episode_fields(c: Completion) -> dict[str, Any]:
    """What a dump row adds for an episode: turns, tool counts, reward terms and the conversation after the prompt."""
    if c.episode is None:
        return {}
    e = c.episode
    return {
        "turns": e.turns,
        "tool_calls": e.tool_calls,
        "tool_errors": e.tool_errors,
        "env_tokens": e.env_tokens,
        "terms": e.terms,
        "messages": e.messages,
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt from n samples of which c are correct: the probability that at least one of k
    samples drawn without replacement is correct. Chen et al. 2021 ("Evaluating Large Language Models Trained on
    Code"), eq. 1, 1 - C(n-c, k) / C(n, k), in the paper's numerically stable product form
    1 - prod_{i=n-c+1}^{n} (1 - k / i) (no large binomials)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n (got n={n}, c={c}, k={k})")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def eval_metrics(
    greedy_rewards: Sequence[float],
    sampled_rewards: Sequence[Sequence[float]] | None,
    sets: Sequence[str | None],
    *,
    threshold: float,
    ks: Sequence[int],
) -> dict[str, float]:
    """eval/accuracy (greedy: fraction of prompts whose reward >= threshold), eval/reward_mean (greedy), and with
    samples (n per prompt) eval/pass@k for each k (pass@1 always: the mean correctness over all samples), averaged
    over prompts; the same under eval/<set>/ for every named eval set in `sets` (one entry per prompt)."""
    groups: dict[str, list[int]] = {"": list(range(len(greedy_rewards)))}
    for name in dict.fromkeys(s for s in sets if s):
        groups[f"{name}/"] = [i for i, s in enumerate(sets) if s == name]
    greedy_ok = np.asarray(greedy_rewards, dtype=float) >= threshold
    out: dict[str, float] = {}
    for prefix, idx in groups.items():
        out[f"eval/{prefix}accuracy"] = float(greedy_ok[idx].mean())
        out[f"eval/{prefix}reward_mean"] = float(np.mean([greedy_rewards[i] for i in idx]))
        if sampled_rewards is None:
            continue
        for k in sorted({1, *ks}):
            per_prompt = []
            for i in idx:
                rewards = sampled_rewards[i]
                per_prompt.append(pass_at_k(len(rewards), sum(r >= threshold for r in rewards), k))
            out[f"eval/{prefix}pass@{k}"] = float(np.mean(per_prompt))
    return out


def write_row(f: IO[str], row: dict[str, Any]) -> None:
    f.write(json.dumps(row, default=str) + "\n")  # default=str: answers may be numbers, lists or other objects


def prompt_text(messages: list[dict]) -> str:
    """The prompt as the user wrote it (the chat template is left out): message contents, one per line."""
    return "\n".join(str(m.get("content", "")) for m in messages)


def eval_rows(
    step: int,
    items: Sequence[dict],
    rollouts: Sequence[PromptRollout],
    rewards: Sequence[float],
    *,
    mode: str,
    threshold: float,
) -> Iterator[dict[str, Any]]:
    """One row per completion of an evaluation (`mode` greedy or sampled); rewards in rollout order."""
    k = 0
    for item, r in zip(items, rollouts):
        for j, c in enumerate(r.completions):
            yield {
                "step": step,
                "eval_set": item.get("metadata", {}).get("eval_set"),
                "prompt": prompt_text(item["messages"]),
                "completion": c.text,
                "answer": item.get("answer"),
                "reward": rewards[k],
                "correct": rewards[k] >= threshold,
                "mode": mode,
                "sample": j,
                "finish_reason": c.finish_reason,
                "length": c.model_tokens,
                "adapter_version": r.adapter_version,
                **episode_fields(c),
            }
            k += 1


def rollout_rows(
    step: int,
    prompts: Sequence[str],
    rollouts: Sequence[PromptRollout],
    rewards: Sequence[float],
    shaped: Sequence[float],
    advantages: Sequence[float],
) -> Iterator[dict[str, Any]]:
    """One row per training completion: the task reward, the shaped reward where shaping changed it (KL in the
    reward, overlong penalty), the advantage the learner used, and where and how it was generated."""
    k = 0
    for g, (prompt, r) in enumerate(zip(prompts, rollouts)):
        for j, c in enumerate(r.completions):
            row = {
                "step": step,
                "group": g,
                "sample": j,
                "prompt": prompt,
                "completion": c.text,
                "reward": rewards[k],
                "advantage": advantages[k],
                "adapter_version": r.adapter_version,
                "actor": r.actor,
                "finish_reason": c.finish_reason,
                "length": c.model_tokens,
                **episode_fields(c),
            }
            if shaped[k] != rewards[k]:
                row["shaped_reward"] = shaped[k]
            yield row
            k += 1
