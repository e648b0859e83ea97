"""The training loop: sample, score, advantages, learn, sync, log; evaluation before and after.

Reads top to bottom like nanochat's chat_rl.py. Departures from the GRPO paper (Shao et al. 2024), on purpose:
- one optimizer step per rollout batch by default (`algorithm.updates_per_step`), so the clipped ratio only
  corrects the train-inference mismatch (behaviour logprobs come from the rollout engine, not the learner);
- the KL penalty to the reference policy is set per bundle (grpo: 0.01 with k3, as in the paper; dapo, dr_grpo: 0);
- outcome rewards only (one scalar per completion), broadcast to every completion token.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl import algorithms, checkpoint, evaluation, filters
from rl.app import UserFacingError
from rl.config import AlgorithmConfig, ClusterMode, ConfigError, TrainConfig
from rl.metrics import MetricsLogger
from rl.pipeline import RolloutQueue
from rl.runtime import MemberDied, Runtime, shard
from rl.types import Adapter, PromptRollout, Sampling, TrainSample

log = logging.getLogger(__name__)

RewardFn = Callable[..., list[float]]


# ------------------------------------------------------------------------------------------------ data


class PromptData:
    """Tokenised prompts (chat template applied once, here) and a seeded, repeating order."""

    def __init__(
        self, items: list[dict], tokenizer: Any, *, max_prompt_tokens: int, use_chat_template: bool, seed: int
    ):
        self.items, self.prompt_ids, self.dropped = [], [], 0
        for it in items:
            ids = encode_prompt(tokenizer, it["messages"], use_chat_template)
            if len(ids) > max_prompt_tokens:  # dropped and counted, never truncated (that would cut the question)
                self.dropped += 1
                continue
            self.items.append(it)
            self.prompt_ids.append(ids)
        self._rng = random.Random(seed)
        self._order: list[int] = []
        self.cursor = 0  # prompts served so far

    def __len__(self) -> int:
        return len(self.items)

    def next_batch(self, n: int) -> list[int]:
        idx = []
        while len(idx) < n:
            if not self._order:
                self._order = list(range(len(self.items)))
                self._rng.shuffle(self._order)
            idx.append(self._order.pop())
            self.cursor += 1
        return idx

    def state_dict(self) -> dict:
        """Cursor and order (the shuffling generator and what is left of the current pass), as plain data."""
        return {
            "n_items": len(self.items),
            "cursor": self.cursor,
            "order": list(self._order),
            "rng": self._rng.getstate(),
        }

    def load_state(self, state: dict) -> None:
        if state["n_items"] != len(self.items):
            raise ConfigError(
                f"the checkpoint was taken with {state['n_items']} training prompts, this run has {len(self.items)}: "
                "resume with the same env and model.max_prompt_tokens"
            )
        self.cursor, self._order = state["cursor"], list(state["order"])
        self._rng.setstate(state["rng"])


def encode_prompt(tokenizer: Any, messages: list[dict], use_chat_template: bool) -> list[int]:
    if use_chat_template:
        enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(enc["input_ids"] if hasattr(enc, "keys") else enc)
    return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]


# ------------------------------------------------------------------------------------------------ steps


def score(reward_fn: RewardFn, rollouts: list[PromptRollout], items: list[dict]) -> list[float]:
    """One reward per completion, in rollout order (prompt by prompt, G completions each)."""
    texts, answers, metas = [], [], []
    for r, it in zip(rollouts, items):
        for c in r.completions:
            texts.append(c.text)
            answers.append(it["answer"])
            metas.append(it.get("metadata", {}))
    return [float(x) for x in reward_fn(texts, answer=answers, metadata=metas)]


def sample_batch(
    runtime: Runtime,
    data: PromptData,
    reward_fn: RewardFn,
    sampling: Sampling,
    n_prompts: int,
    filter_range: list[float] | None = None,
    max_rounds: int = 1,
    first: Callable[[], tuple[list[int], list[PromptRollout]]] | None = None,
) -> tuple[list[PromptRollout], list[float], dict]:
    """Generate and score n_prompts groups of sampling.n completions; returns rollouts, task rewards, stats.

    `first` returns the first round's prompt indices and rollouts when they were sent ahead (rl/pipeline.py);
    later rounds are generated here, with the actors' current adapter.

    With `filter_range` (dynamic sampling, DAPO eq. 11) only groups whose accuracy lies in the range are kept, and
    generation repeats, at most `max_rounds` batches, until n_prompts groups are kept. When the rounds run out it
    trains on the groups it has (on the last batch if none was kept); `data/sample_utilization` shows the cost.
    """
    G = sampling.n
    kept, kept_rewards = [], []
    generated = gen_tokens = 0
    t_rollout = t_reward = 0.0
    for round_ in range(max_rounds):
        t0 = time.perf_counter()
        if round_ == 0 and first is not None:
            idx, rollouts = first()
        else:
            idx = data.next_batch(n_prompts)
            rollouts = runtime.generate([data.prompt_ids[i] for i in idx], sampling)
        t_rollout += time.perf_counter() - t0
        t0 = time.perf_counter()
        rewards = score(reward_fn, rollouts, [data.items[i] for i in idx])
        t_reward += time.perf_counter() - t0
        generated += len(rollouts)
        gen_tokens += sum(len(c.token_ids) for r in rollouts for c in r.completions)
        keep = (
            filters.keep_groups_in_range(torch.tensor(rewards), G, *filter_range)
            if filter_range
            else torch.ones(len(rollouts), dtype=torch.bool)
        )
        for g, r in enumerate(rollouts):
            if keep[g]:
                kept.append(r)
                kept_rewards.extend(rewards[g * G : (g + 1) * G])
        if len(kept) >= n_prompts:
            break
    utilization = filters.sample_utilization(min(len(kept), n_prompts), generated)
    if not kept:
        kept, kept_rewards = rollouts, rewards
    kept, kept_rewards = kept[:n_prompts], kept_rewards[: n_prompts * G]
    stats = {
        "data/sample_utilization": utilization,
        "data/kept_groups": float(len(kept)),
        "time/rollout_s": t_rollout,
        "time/reward_s": t_reward,
        "perf/rollout_tokens_per_s": gen_tokens / max(t_rollout, 1e-9),
    }
    return kept, kept_rewards, stats


def prepare_samples(
    rollouts: list[PromptRollout], rewards: list[float], a: AlgorithmConfig, max_new_tokens: int
) -> tuple[list[TrainSample], torch.Tensor, dict]:
    """Reward shaping -> advantages -> loss masks -> top-k: the learner's samples, the advantages [B*G], metrics.

    Knobs the chosen advantage estimator does not use are ignored by it (see rl/algorithms.py)."""
    completions = [c for r in rollouts for c in r.completions]
    lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.float32)  # [B*G]
    shaped, metrics = shape_rewards(rewards, lengths, a, max_new_tokens)
    in_loss = (
        filters.truncated_mask([c.finish_reason for c in completions])
        if a.filter_truncated_response
        else [True] * len(completions)
    )
    adv = algorithms.get_advantage(a.advantage)(
        shaped,
        a.group_size,
        std_normalize=a.std_normalize,
        std_unbiased=a.std_unbiased,
        pg_baseline=a.pg_baseline,
        eps=a.adv_eps,
        lengths=lengths * torch.tensor(in_loss, dtype=torch.float32),
    )
    samples = [
        TrainSample(r.prompt_ids, c.token_ids, c.logprobs, float(adv[k]), [] if in_loss[k] else [0] * len(c.token_ids))
        for k, (r, c) in enumerate((r, c) for r in rollouts for c in r.completions)
    ]
    metrics["response/masked_truncated_frac"] = 1.0 - sum(in_loss) / max(len(in_loss), 1)
    if a.top_k is not None and a.top_k < a.group_size:
        samples = [samples[i] for i in filters.top_k_per_group(shaped, a.group_size, a.top_k).tolist()]
    metrics["train/samples"] = float(len(samples))
    return samples, adv, metrics


def shape_rewards(
    rewards: list[float], lengths: torch.Tensor, a: AlgorithmConfig, max_new_tokens: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """The rewards the advantages are computed from [B*G]: with DAPO's soft overlong punishment (eq. 13) added."""
    shaped = torch.tensor(rewards, dtype=torch.float32)  # [B*G]
    if not a.overlong_penalty:
        return shaped, {}
    buffer = a.overlong_buffer or filters.default_overlong_buffer(max_new_tokens)
    if buffer > max_new_tokens:
        raise ConfigError(f"algorithm.overlong_buffer={buffer} exceeds model.max_new_tokens={max_new_tokens}: lower it")
    penalty = filters.overlong_penalty(lengths, max_new_tokens, buffer, a.overlong_penalty_factor)
    return shaped + penalty, {"reward/overlong_penalty_mean": float(penalty.mean())}


def kl_reward_penalty(
    runtime: Runtime, rollouts: list[PromptRollout], rewards: list[float], a: AlgorithmConfig
) -> tuple[list[float], dict[str, float]]:
    """KL folded into the reward (InstructGPT, Ouyang et al. 2022, eq. 2; REINFORCE++): each completion's reward
    becomes r - kl_coef * sum_t kl_t, with kl_t estimated on the sampled tokens from the behaviour logprobs and
    the reference policy (the learner with its adapter disabled). The advantages are then computed on that."""
    ref = runtime.reference_logprobs(rollouts)
    behaviour = [c.logprobs for r in rollouts for c in r.completions]
    per_seq = [
        float(algorithms.kl_penalty(torch.tensor(b), torch.tensor(q), a.kl_estimator).sum())
        for b, q in zip(behaviour, ref)
    ]
    shaped = [r - a.kl_coef * k for r, k in zip(rewards, per_seq)]
    return shaped, {
        "reward/kl_penalty_mean": a.kl_coef * float(np.mean(per_seq)),
        "policy/kl_ref_seq": float(np.mean(per_seq)),
    }


def rollout_metrics(rollouts: list[PromptRollout], rewards: list[float], adv: torch.Tensor, group_size: int) -> dict:
    lengths = [len(c.token_ids) for r in rollouts for c in r.completions]
    truncated = [c.finish_reason == "length" for r in rollouts for c in r.completions]
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
    }


@dataclass
class EvalSpec:
    """How to evaluate (plain values from TrainConfig's eval_* keys)."""

    max_tokens: int
    n_samples: int = 0  # sampled completions per prompt for pass@k (0: greedy only)
    temperature: float = 1.0
    pass_k: tuple[int, ...] = (1,)
    threshold: float = 1.0  # reward >= threshold counts as correct
    save_dir: Path | None = None  # one step_N.jsonl per evaluation, a row per completion (None: not written)


def evaluate(runtime: Runtime, data: PromptData, reward_fn: RewardFn, spec: EvalSpec, step: int) -> dict[str, float]:
    """Greedy accuracy on the held-out prompts and, with spec.n_samples > 0, pass@1 and pass@k over that many
    samples per prompt (unbiased estimator, Chen et al. 2021 eq. 1; rl/evaluation.py), overall and per named eval
    set (envs/data.py metadata.eval_set); every completion is written to spec.save_dir/step_N.jsonl."""
    if len(data) == 0:
        return {}
    t0 = time.perf_counter()
    greedy = runtime.generate(data.prompt_ids, Sampling(n=1, temperature=0.0, max_tokens=spec.max_tokens))
    runs = [("greedy", greedy, score(reward_fn, greedy, data.items))]
    if spec.n_samples:
        sampling = Sampling(n=spec.n_samples, temperature=spec.temperature, max_tokens=spec.max_tokens)
        sampled = runtime.generate(data.prompt_ids, sampling)
        runs.append(("sampled", sampled, score(reward_fn, sampled, data.items)))
    n = spec.n_samples
    out = evaluation.eval_metrics(
        runs[0][2],
        [runs[1][2][i * n : (i + 1) * n] for i in range(len(data))] if n else None,
        [it.get("metadata", {}).get("eval_set") for it in data.items],
        threshold=spec.threshold,
        ks=spec.pass_k,
    )
    out["eval/length_mean"] = float(np.mean([len(r.completions[0].token_ids) for r in greedy]))
    out["eval/n"] = float(len(data))
    if spec.save_dir is not None:
        with evaluation.atomic_jsonl(spec.save_dir / f"{checkpoint.step_dir_name(step)}.jsonl") as f:
            for mode, rollouts, rewards in runs:
                for row in evaluation.eval_rows(
                    step, data.items, rollouts, rewards, mode=mode, threshold=spec.threshold
                ):
                    evaluation.write_row(f, row)
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
    max_new_tokens: int,
) -> None:
    """Every completion of a training step (rollout_save_interval) as jsonl, written atomically: task `rewards`,
    the rewards after all shaping (`shaped` is after the KL-in-reward penalty; the overlong penalty is added here,
    as prepare_samples does), the advantages [B*G]. The prompt is decoded from the token ids the model saw."""
    lengths = torch.tensor([len(c.token_ids) for r in rollouts for c in r.completions], dtype=torch.float32)
    final = shape_rewards(shaped, lengths, a, max_new_tokens)[0].tolist()
    prompts = [tokenizer.decode(r.prompt_ids) for r in rollouts]
    with evaluation.atomic_jsonl(path) as f:
        for row in evaluation.rollout_rows(step, prompts, rollouts, rewards, final, adv.tolist()):
            evaluation.write_row(f, row)


def reward_counts(reward_fn: RewardFn) -> dict[str, float]:
    """reward/errors and reward/timeouts since the last call, for rewards that count them (rewards/runner.py)."""
    return reward_fn.pop_metrics() if hasattr(reward_fn, "pop_metrics") else {}


# ------------------------------------------------------------------------------------------------ loop


def train(
    cfg: TrainConfig,
    runtime: Runtime,
    tokenizer: Any,
    env: Any,
    reward_fn: RewardFn,
    logger: MetricsLogger,
    probe_threshold: float = 0.1,
    resolved: dict | None = None,
) -> dict[str, float]:
    """Run cfg.steps RL steps on `runtime` (from the checkpoint `cfg.resume` names, if any); return a summary
    (eval accuracy before/after, timings). `resolved` is the config saved with each checkpoint."""
    seed_everything(cfg.seed)
    m, a = cfg.model, cfg.algorithm
    train_data = PromptData(
        env.train_items(),
        tokenizer,
        max_prompt_tokens=m.max_prompt_tokens,
        use_chat_template=m.use_chat_template,
        seed=cfg.seed,
    )
    eval_data = PromptData(
        env.eval_items()[: cfg.eval_size],
        tokenizer,
        max_prompt_tokens=m.max_prompt_tokens,
        use_chat_template=m.use_chat_template,
        seed=cfg.seed,
    )
    if len(train_data) == 0:
        raise ValueError(
            f"no training prompts left: {train_data.dropped} were longer than model.max_prompt_tokens={m.max_prompt_tokens}"
        )
    algorithms.get_advantage(a.advantage)  # fail before the first rollout on an unknown name
    sampling = Sampling(n=a.group_size, temperature=a.temperature, top_p=a.top_p, max_tokens=m.max_new_tokens)
    probe_prompts = train_data.prompt_ids[:2]
    probe_sampling = Sampling(n=2, temperature=a.temperature, top_p=a.top_p, max_tokens=16)

    summary: dict[str, float] = {
        "data/train_prompts": len(train_data),
        "data/dropped_long_prompts": train_data.dropped + eval_data.dropped,
    }
    run_dir = Path(logger.run_dir)
    eval_spec = EvalSpec(
        max_tokens=m.max_new_tokens,
        n_samples=cfg.eval_n_samples,
        temperature=cfg.eval_temperature,
        pass_k=tuple(cfg.eval_pass_k),
        threshold=cfg.eval_correct_threshold,
        save_dir=Path(cfg.eval_save_dir) if cfg.eval_save_dir else run_dir / "eval",
    )
    rollout_dir = Path(cfg.rollout_save_dir) if cfg.rollout_save_dir else run_dir / "rollouts"
    # The probe's floor: learner vs actor on the base model (version 0 on both sides: a correct sync) before any
    # training step. It is numerics (bf16: ~0.03-0.09) and, with a 4-bit learner against a bf16 actor, quantisation
    # (~0.2 on Qwen2.5-0.5B shapes); a missed sync shows as a rise above it. Measured before a checkpoint is
    # restored, so the sampling it does never shifts a resumed run's restored random streams.
    floor = runtime.probe_finish(runtime.probe_submit(probe_prompts, probe_sampling))
    summary["sync/probe_floor"] = floor
    probe_threshold = floor + probe_threshold
    print(f"sync probe floor {floor:.4f}: a step fails above {probe_threshold:.4f}", flush=True)
    start = 1
    ckpt = checkpoint.resolve_resume(cfg.resume, run_dir)
    if ckpt is not None:
        start = checkpoint.restore_run(ckpt, runtime, train_data) + 1
        logger.drop_after(start - 1)  # rows of steps after the checkpoint were lost work; they are redone
    elif cfg.resume == "auto":
        print(f"resume=auto: no checkpoint in {run_dir / checkpoint.CHECKPOINTS}, starting at step 1", flush=True)
    before = evaluate(runtime, eval_data, reward_fn, eval_spec, 0) if cfg.eval_size and start == 1 else {}
    if before:
        logger.log(0, before)
        logger.console(0, before)
        summary["eval/accuracy_before"] = before["eval/accuracy"]

    queue = RolloutQueue(runtime, train_data, sampling, cfg.prompts_per_step, cfg.cluster.staleness)
    probe = None  # the last sync's probe, when it is read in the next step (staleness > 0: the actors are busy)
    nonfinite = 0  # steps in a row whose loss was NaN/inf (each optimizer step skipped)
    runtime.pop_idle(1.0)  # idle time is measured from here
    t_run = time.perf_counter()
    logger.start_progress(start - 1)
    step = start
    try:
        for step in range(start, cfg.steps + 1):
            t_step = time.perf_counter()
            queue.fill(steps_left=cfg.steps - step + 1)
            rollouts, rewards, stats = sample_batch(
                runtime,
                train_data,
                reward_fn,
                sampling,
                cfg.prompts_per_step,
                filter_range=list(a.filter_range) if a.dynamic_sampling else None,
                max_rounds=a.dynamic_sampling_max_rounds if a.dynamic_sampling else 1,
                first=queue.take,
            )
            if cfg.cluster.staleness:  # the batch was generated while the learners worked: its wait is no rate
                stats.pop("perf/rollout_tokens_per_s")
            probe_diff = check_probe(runtime.probe_finish(probe), step - 1, probe_threshold) if probe else None
            shaped, kl_metrics = kl_reward_penalty(runtime, rollouts, rewards, a) if a.kl_in_reward else (rewards, {})
            samples, adv, sample_metrics = prepare_samples(rollouts, shaped, a, m.max_new_tokens)
            if cfg.rollout_save_interval and step % cfg.rollout_save_interval == 0:
                path = rollout_dir / f"{checkpoint.step_dir_name(step)}.jsonl"
                save_rollouts(path, step, tokenizer, rollouts, rewards, shaped, adv, a, m.max_new_tokens)
            behind = [runtime.steps_behind(r.adapter_version) for r in rollouts]
            metrics = {
                **kl_metrics,
                **rollout_metrics(rollouts, rewards, adv, a.group_size),
                **stats,
                **sample_metrics,
                **reward_counts(reward_fn),
                **runtime.pop_counts(),
                "async/staleness_mean": float(np.mean(behind)),
                "async/staleness_max": float(max(behind)),
                "actor/adapter_version": float(min(r.adapter_version for r in rollouts)),
                "data/learner_generated_frac": float(np.mean([r.actor < 0 for r in rollouts])),
            }

            metrics.update(learn(runtime, samples, a.updates_per_step))
            nonfinite = nonfinite + 1 if metrics["train/skipped_nonfinite"] else 0
            if nonfinite:
                print(
                    f"step {step}: non-finite loss ({metrics['train/loss']}), optimizer step skipped "
                    f"({nonfinite} in a row; the run stops at max_nonfinite_steps={cfg.max_nonfinite_steps})",
                    flush=True,
                )
            metrics.update(runtime.sync())
            probe = runtime.probe_submit(probe_prompts, probe_sampling)
            if cfg.cluster.staleness == 0 or step == cfg.steps:
                probe_diff, probe = check_probe(runtime.probe_finish(probe), step, probe_threshold), None
            if probe_diff is not None:  # with staleness > 0: the previous step's sync, read before this step learnt
                metrics["sync/logprob_abs_diff"] = probe_diff

            metrics.update({"time/step_s": time.perf_counter() - t_step, "data/cursor": float(train_data.cursor)})
            metrics.update(runtime.pop_idle(metrics["time/step_s"]))
            if cfg.eval_size and cfg.eval_interval and step % cfg.eval_interval == 0 and step != cfg.steps:
                metrics.update(evaluate(runtime, eval_data, reward_fn, eval_spec, step))
            logger.log(step, metrics)
            logger.console(step, metrics)
            summary["reward/last"] = metrics["reward/mean"]
            if cfg.save_interval and (step % cfg.save_interval == 0 or step == cfg.steps):
                # `queue` saves the data position before the prompts still in flight: a resume generates them again
                checkpoint.save_run(run_dir, step, runtime, queue, keep_last=cfg.keep_last, config=resolved)
            if nonfinite >= cfg.max_nonfinite_steps:
                raise RunStopped(
                    stop_message(
                        f"{nonfinite} steps in a row had a non-finite loss (NaN/inf; max_nonfinite_steps="
                        f"{cfg.max_nonfinite_steps}), stopped after step {step}; check the reward for NaN/inf or "
                        "lower algorithm.lr",
                        run_dir,
                    )
                )
    except MemberDied as e:
        if e.role != "learner":
            raise
        raise RunStopped(stop_message(f"learner {e.index} died at step {step} ({e.cause})", run_dir)) from e

    summary["time/train_s"] = time.perf_counter() - t_run
    final = runtime.adapter()
    if final.config.get("full_weights"):
        save_full_model(final, Path(logger.run_dir) / "model", source=Path(tokenizer.name_or_path))
    else:
        save_adapter(final, Path(logger.run_dir) / "adapter")
    after = evaluate(runtime, eval_data, reward_fn, eval_spec, cfg.steps) if cfg.eval_size else {}
    if after:
        logger.log(cfg.steps, after)
        summary["eval/accuracy_after"] = after["eval/accuracy"]
    return summary


class RunStopped(UserFacingError):
    """The run cannot go on (a learner died, the loss stays non-finite); the message says how to resume."""


def stop_message(reason: str, run_dir: Path) -> str:
    last = checkpoint.latest(run_dir)
    where = f"last checkpoint: {last}" if last else "no checkpoint was saved yet (save_interval)"
    return f"{reason}; {where}; resume with: python train.py resume=auto output_dir={run_dir} (same overrides)"


def check_probe(diff: float, step: int, threshold: float) -> float:
    """`threshold` = the floor measured before training + sync_probe_threshold."""
    if diff > threshold:
        raise RuntimeError(
            f"adapter sync check failed at step {step}: mean |logp_learner - logp_actor| = {diff:.4f} > "
            f"{threshold:.4f} (probe floor before training + sync_probe_threshold): the actor is not running the "
            "learner's adapter"
        )
    return diff


def learn(runtime: Runtime, samples: list[TrainSample], updates: int) -> dict[str, float]:
    """`updates` optimizer steps over consecutive mini-batches of the step's samples (PPO-style; each mini-batch
    is normalised on its own); metrics are averaged, times summed. The ratio stays against the behaviour policy."""
    chunks = [c for c in shard(samples, updates) if c]
    results = [runtime.train_step(c) for c in chunks]
    out = {k: float(np.mean([r[k] for r in results])) for k in results[0]}
    out["time/learn_s"] = float(sum(r["time/learn_s"] for r in results))
    out["train/optimizer_steps"] = float(len(chunks))
    return out


def save_adapter(adapter: Adapter, folder: Path) -> None:
    """Write the adapter in PEFT format (loadable by PeftModel.from_pretrained and vLLM's LoRA loader),
    under a temporary name first, so an interrupted write never leaves a half-written adapter folder."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "adapter_config.json").write_text(json.dumps(adapter.config, indent=2, default=str))
    (tmp / "adapter_model.safetensors").write_bytes(adapter.weights)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def save_full_model(weights: Adapter, folder: Path, source: Path) -> None:
    """Write a full fine-tuning result as an HF model folder (from_pretrained / vLLM load it): the trained
    weights as model.safetensors, next to the source folder's config, generation config and tokenizer files.
    Written under a temporary name first, like the adapter."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".index.json", ".gguf")):
            shutil.copy2(f, tmp / f.name)
    (tmp / "model.safetensors").write_bytes(weights.weights)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------------ building


def build_runtime(cfg: TrainConfig, model_path: str) -> tuple[Runtime, Callable[[], None]]:
    """Create the roles (in-process or as Ray actors); returns the runtime and a function that tears it down."""
    from rl.learner import PeftLearner, resolve_backend
    from rl.rollout import cpu_threads_env

    m, a, c = cfg.model, cfg.algorithm, cfg.cluster
    if not c.use_gpu and (m.learner_backend == "unsloth" or m.load_in_4bit):
        what = "model.learner_backend=unsloth" if m.learner_backend == "unsloth" else "model.load_in_4bit=true"
        raise ConfigError(
            f"{what} needs CUDA GPUs: set cluster.use_gpu=true on a GPU machine, or model.learner_backend=peft "
            "model.load_in_4bit=false"
        )
    rollout_cls, rollout_kwargs = rollout_role(cfg, model_path)
    learner_kwargs = dict(
        lora_rank=m.lora_rank,
        lora_alpha=m.lora_alpha,
        lora_dropout=m.lora_dropout,
        lora_targets=list(m.lora_targets),
        dtype=m.learner_dtype.value,
        lr=a.lr,
        weight_decay=a.weight_decay,
        max_grad_norm=a.max_grad_norm,
        policy_loss=a.policy_loss,
        loss_agg=a.loss_agg,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        dual_clip=a.dual_clip,
        tis_cap=a.tis_cap,
        skip_threshold=a.skip_threshold,
        entropy_coef=a.entropy_coef,
        loss_agg_norm_length=a.loss_agg_norm_length or m.max_new_tokens,
        kl_coef=0.0 if a.kl_in_reward else a.kl_coef,  # folded into the reward instead (kl_reward_penalty)
        kl_estimator=a.kl_estimator,
        temperature=a.temperature,
        micro_batch_size=cfg.micro_batch_size,
        share_prompt_prefix=cfg.share_prompt_prefix,
        seed=cfg.seed,
        num_threads=c.learner_threads,
        trust_remote_code=m.trust_remote_code,
        backend=resolve_backend(m.learner_backend, cuda=c.use_gpu),
        load_in_4bit=m.load_in_4bit,
        full_finetune=m.full_finetune,
        gradient_checkpointing=m.gradient_checkpointing,
        max_seq_length=m.max_prompt_tokens + m.max_new_tokens,
        # a vLLM actor holds LoRA factors in its weights' dtype either way (merged or native): send them so
        sync_dtype=m.dtype.value
        if c.rollout_backend.value == "vllm" and m.dtype.value in ("bfloat16", "float16")
        else None,
        keep_reference=a.kl_coef > 0,  # in the loss or folded into the reward: both need the reference policy
    )
    import os

    # the driver's vLLM settings (e.g. VLLM_ENABLE_V1_MULTIPROCESSING) reach the actors, also on other nodes
    actor_env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    actor_env.update({} if c.use_gpu else cpu_threads_env(c.actor_threads))
    # Unsloth must be the first ML import of the learner's process (rl/__init__.py reads this)
    learner_env = {"RLFT_IMPORT_UNSLOTH": "1"} if learner_kwargs["backend"] == "unsloth" else {}
    if c.mode == ClusterMode.local:
        from rl.runtime import LocalGroup

        os.environ.update(actor_env)
        if learner_env:  # too late to come first in this process (torch is loaded); PeftLearner warns
            import unsloth  # noqa: F401
        learner = PeftLearner(model_path, **learner_kwargs)
        rollout = rollout_cls(model_path, **rollout_kwargs)
        runtime = Runtime(
            LocalGroup([rollout]),
            LocalGroup([learner]),
            learner_chunk_size=c.learner_chunk_size,
            weight_sync=c.weight_sync,
        )
        return runtime, runtime.close

    from rl import placement

    started = placement.start_ray(c.address, c.ray_num_cpus, {})
    try:
        runtime = placement.build_ray_runtime(
            rollout_cls=rollout_cls,
            rollout_kwargs={"model_path": model_path, **rollout_kwargs},
            learner_cls=PeftLearner,
            learner_kwargs={"model_path": model_path, **learner_kwargs},
            num_actors=c.num_actors,
            num_learners=c.num_learners,
            use_gpu=c.use_gpu,
            gpus_per_actor=c.gpus_per_actor,
            gpus_per_learner=c.gpus_per_learner,
            cpus_per_actor=c.cpus_per_actor,
            cpus_per_learner=c.cpus_per_learner,
            strategy=c.placement_strategy,
            actor_env=actor_env,
            learner_env=learner_env,
            staleness=c.staleness,
            actor_max_restarts=c.actor_max_restarts,
            learner_chunk_size=c.learner_chunk_size,
            weight_sync=c.weight_sync,
        )
    except BaseException:
        placement.stop_ray(started)
        raise

    def teardown() -> None:
        runtime.close()
        placement.stop_ray(started)

    return runtime, teardown


def rollout_role(cfg: TrainConfig, model_path: str) -> tuple[type, dict]:
    m, c = cfg.model, cfg.cluster
    if c.rollout_backend.value == "hf":
        from rl.hf_rollout import HFRollout

        return HFRollout, dict(dtype=m.dtype.value, seed=cfg.seed, trust_remote_code=m.trust_remote_code)
    from rl.rollout import VLLMRollout, resolve_lora_mode

    lora_mode = resolve_lora_mode(c.lora_mode, bool(c.use_gpu))
    if m.full_finetune:  # no adapter: full weights are loaded by the worker extension, no LoRA slots needed
        lora_mode = "merged"
    return VLLMRollout, dict(
        lora_mode=lora_mode,
        max_lora_rank=m.lora_rank,
        dtype=m.dtype.value,
        max_model_len=m.max_prompt_tokens + m.max_new_tokens,
        seed=cfg.seed,
        gpu_memory_utilization=c.gpu_memory_utilization,
        enforce_eager=c.enforce_eager,
        tensor_parallel_size=max(1, int(c.gpus_per_actor)) if c.use_gpu else 1,
        trust_remote_code=m.trust_remote_code,
        weight_sync=c.weight_sync,
        full_weights=m.full_finetune,
    )
