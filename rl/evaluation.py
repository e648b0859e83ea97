"""Evaluation metrics (greedy accuracy, pass@k) and the per-sample jsonl files a run writes (eval, rollouts).

Plain functions over plain data: no Ray, no config objects; rl/driver.py generates and scores, then calls these.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from rl.types import PromptRollout


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


@contextmanager
def atomic_jsonl(path: Path) -> Iterator[IO[str]]:
    """A line-buffered jsonl file written under a temporary name (`.<name>.tmp` beside it) and renamed to `path`
    only when the block completes; an interrupted write leaves the temporary file, never a short `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", buffering=1) as f:
        yield f
    os.replace(tmp, path)


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
                "length": len(c.token_ids),
                "adapter_version": r.adapter_version,
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
                "length": len(c.token_ids),
            }
            if shaped[k] != rewards[k]:
                row["shaped_reward"] = shaped[k]
            yield row
            k += 1
