"""The training loop: sample, score, advantages, learn, sync, probe, log, checkpoint; evaluation before and after.

Reads top to bottom like nanochat's chat_rl.py: each part of a step is a named call into its own module
(rl/loop/sampler.py, rl/loop/prepare.py, rl/loop/probe.py, rl/loop/evaluation.py, rl/loop/checkpoint.py). Departures from the GRPO paper
(Shao et al. 2024), on purpose:
- one optimizer step per rollout batch by default (`algorithm.updates_per_step`), so the clipped ratio only
  corrects the train-inference mismatch (behaviour logprobs come from the rollout engine, not the learner);
- the KL penalty to the reference policy is set per bundle (grpo: 0.01 with k3, as in the paper; dapo, dr_grpo: 0);
- outcome rewards only (one scalar per completion), broadcast to every completion token.
With algorithm=sft (a supervised warm start) a step's samples are demonstrations (rl/data/demos.py) instead of
sampled and scored rollouts; the rest of the loop is the same.

The loop's one wiring point: `train` takes the resolved `TrainConfig` and hands each part (data, curriculum,
sampler, probe, evaluation, batch preparation) the groups and values it uses; below this module no loop part names
the whole config (tests/unit/test_imports.py holds it).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rewards.protocol import RewardFn
from rl.config.choices import ActorBase, RolloutMode
from rl.config.schema import ConfigError, TrainConfig
from rl.data.curriculum import Curriculum, build_curriculum
from rl.data.demos import Demonstrations
from rl.data.prompts import PromptData
from rl.errors import RunStopped
from rl.loop import checkpoint, evaluation
from rl.loop.continuous import ContinuousSampler
from rl.loop.prepare import distill_advantages, kl_reward_penalty, prepare_samples, rollout_metrics
from rl.loop.probe import SyncProbe
from rl.loop.sampler import Batch, Sampler
from rl.loop.source import BatchSource, RolloutSource
from rl.metrics import MetricsLogger
from rl.runtime.groups import MemberDied, shard
from rl.runtime.runtime import Runtime
from rl.types import TrainSample


def train(
    cfg: TrainConfig,
    runtime: Runtime,
    tokenizer: Any,
    env: Any,
    reward_fn: RewardFn,
    logger: MetricsLogger,
    resolved: dict,
    run_data: RunData | None = None,
) -> dict[str, float]:
    """Run cfg.run.steps RL steps on `runtime` (from the checkpoint `run.resume` names, if any); return a summary
    (eval accuracy before/after, timings). `resolved` is the config saved with each checkpoint; `run_data` is
    `load_data`'s (made here when not given)."""
    steps = cfg.run.steps
    seed_everything(cfg.run.seed)
    d = run_data or load_data(cfg, tokenizer, env)
    train_data, eval_data, demos, curriculum = d.train, d.eval, d.demos, d.curriculum
    data: RolloutSource | Demonstrations
    if demos is not None:
        data = demos
    else:
        data = make_sampler(cfg, runtime, train_data, reward_fn, tokenizer=tokenizer, curriculum=curriculum)
    a = cfg.algorithm
    evaluate = functools.partial(
        evaluation.evaluate,
        runtime,
        eval_data,
        reward_fn,
        cfg.eval,
        greedy=cfg.sampling_for("greedy"),
        sampled=cfg.sampling_for("eval"),
        seed=cfg.run.seed,
    )
    probe = SyncProbe(
        runtime,
        train_data.prompt_ids[:2],
        cfg.sampling_for("probe"),
        threshold=cfg.run.sync_probe_threshold,
        deferred=not isinstance(data, Demonstrations) and data.overlapped,
        seed=cfg.run.seed,
        floor_limit=None if full_precision_sampler(cfg) else cfg.run.probe_floor_limit,
    )
    if cfg.model.init_adapter:  # the actors start from the learner's starting adapter (version 0) too
        runtime.sync()
    summary: dict[str, float] = {
        "data/train_prompts": len(train_data),
        "data/dropped_long_prompts": train_data.dropped + eval_data.dropped,
        "sync/probe_floor": probe.measure_floor(),
    }
    if demos is not None:
        summary |= {"data/demos": len(demos), "data/dropped_long_demos": demos.dropped}
    if full_precision_sampler(cfg):
        print(
            f"model.actor_base=original: the actors sample model.path's full-precision weights beside the 4-bit "
            f"learner, {summary['sync/probe_floor']:.4f} nats per token apart before training",
            flush=True,
        )
    start = resume(cfg, runtime, data, logger) + 1
    if cfg.eval.size and start == 1:
        acc = log_eval(evaluate, logger, step=0)
    else:  # a resumed run: the evaluation before training is in its metrics
        acc = logger.value_at(0, "eval/accuracy") if cfg.eval.size else None
    if acc is not None:
        summary["eval/accuracy_before"] = acc
    nonfinite = 0  # steps in a row whose loss was NaN/inf (each optimizer step skipped)
    runtime.pop_idle(1.0)  # idle time is measured from here
    t_run = time.perf_counter()
    logger.start_progress(start - 1)
    step = start
    try:
        for step in range(start, steps + 1):
            t_step, t_probe = time.perf_counter(), 0.0
            if isinstance(data, Demonstrations):
                samples, m = data.next(cfg.run.prompts_per_step)
            else:
                batch = data.next(step)  # generate (or collect what was sent ahead) + score + dynamic sampling
                t = time.perf_counter()
                m = probe.collect()  # the previous sync's probe, when it was read late (staleness > 0)
                t_probe, t = time.perf_counter() - t, time.perf_counter()
                samples, sm = prepare(cfg, runtime, tokenizer, batch, step, logger)  # shaping -> advantages -> masks
                m |= sm | {"time/prepare_s": time.perf_counter() - t}
            # a continuous rollout keeps its actors fed while the learners step
            m |= learn(runtime, samples, a.updates_per_step, data.pump)
            nonfinite = count_nonfinite(m, nonfinite, step, cfg)
            m |= runtime.sync()
            t = time.perf_counter()
            m |= probe.after_sync(step, last=step == steps)
            m["time/probe_s"] = t_probe + time.perf_counter() - t  # the sync probe's calls and its wait for them
            m |= throughput(m, samples, time.perf_counter() - t_step)
            m |= runtime.pop_idle(m["time/step_s"])
            if cfg.eval.size and cfg.eval.interval and step % cfg.eval.interval == 0 and step != steps:
                m |= evaluate(step)
            logger.log(step, m)
            logger.console(step, m)
            if "reward/mean" in m:
                summary["reward/last"] = m["reward/mean"]
            every = cfg.checkpoint.interval
            if every and (step % every == 0 or step == steps):
                checkpoint.save_run(
                    cfg.run_dir, step, runtime, data, keep_last=cfg.checkpoint.keep_last, config=resolved
                )
            if nonfinite >= cfg.run.max_nonfinite_steps:
                raise RunStopped(stop_message(nonfinite_reason(nonfinite, step, cfg), cfg.run_dir))
    except MemberDied as e:
        if e.role != "learner":
            raise
        raise RunStopped(stop_message(f"learner {e.index} died at step {step} ({e.cause})", cfg.run_dir)) from e
    summary["time/train_s"] = time.perf_counter() - t_run
    checkpoint.export_result(runtime.adapter(), cfg.run_dir, source=Path(cfg.model.path))
    if cfg.eval.size and (acc := log_eval(evaluate, logger, step=steps)) is not None:
        summary["eval/accuracy_after"] = acc
    return summary


def make_sampler(
    cfg: TrainConfig,
    runtime: Runtime,
    data: PromptData,
    reward_fn: RewardFn,
    *,
    steps: int | None = None,
    tokenizer: Any = None,
    curriculum: Curriculum | None = None,
) -> Sampler | ContinuousSampler:
    """The batch source `cluster.rollout_mode` names, given what it reads of the resolved `cfg`; `steps`: the last
    step it will be asked for (run.steps); `tokenizer` decodes a continuous rollout's segments."""
    common: dict[str, Any] = dict(
        sampling=cfg.sampling_for("train"),
        steps=cfg.run.steps if steps is None else steps,
        staleness=cfg.cluster.staleness,
        correct_threshold=cfg.eval.correct_threshold,
        curriculum=curriculum,
    )
    if cfg.cluster.rollout_mode == RolloutMode.continuous:
        groups = cfg.groups_in_flight
        return ContinuousSampler(
            runtime, data, reward_fn, cfg.run, cfg.algorithm, tokenizer=tokenizer, groups_in_flight=groups, **common
        )
    return Sampler(runtime, data, reward_fn, cfg.run, cfg.algorithm, **common)


def full_precision_sampler(cfg: TrainConfig) -> bool:
    """A 4-bit learner whose actors serve model.path's own weights on purpose (model.actor_base=original)."""
    return cfg.model.load_in_4bit and cfg.model.actor_base == ActorBase.original


@dataclass(frozen=True)
class RunData:
    """What a run trains and evaluates on: the tokenized prompts, the demonstrations of algorithm=sft, the
    curriculum (None with demonstrations)."""

    train: PromptData
    eval: PromptData
    demos: Demonstrations | None
    curriculum: Curriculum | None


def load_data(cfg: TrainConfig, tokenizer: Any, env: Any) -> RunData:
    """The run's data, made before any role starts (rl/app.py), so that data the settings leave empty or a
    curriculum the env cannot run fails in one line at once, not after Ray and the engines have started."""
    m, seed = cfg.model, cfg.run.seed
    train_data = prompt_data(env.train_items(), tokenizer, cfg)
    eval_data = prompt_data(env.eval_items()[: cfg.eval.size], tokenizer, cfg)
    if len(train_data) == 0:
        raise ConfigError(
            f"no training prompts left: all {train_data.dropped} are longer than model.max_prompt_tokens="
            f"{cfg.model.max_prompt_tokens} tokens (after the chat template): raise model.max_prompt_tokens"
        )
    if cfg.eval.size and len(eval_data) == 0:  # else the run ends with no held-out accuracy and no word why
        too_long = f" ({eval_data.dropped} longer than model.max_prompt_tokens)" if eval_data.dropped else ""
        print(
            f"no held-out evaluation: the env gives no eval prompts{too_long}; a dataset env (env=jsonl, gsm8k, "
            "math500) evaluates on env.eval_sets={name: file} or env.eval_holdout=N training items (eval.size=0 says "
            "none)",
            flush=True,
        )
    # algorithm=sft trains on demonstrations (a warm start): no rollouts, the actors evaluate and are probed
    a = cfg.algorithm
    demos = Demonstrations(a.demos, tokenizer, m, budget=cfg.completion_tokens, seed=seed) if a.demos else None
    curriculum = None
    if demos is None:
        make_data = functools.partial(PromptData, tokenizer=tokenizer, model=m, seed=seed)
        curriculum = build_curriculum(cfg.curriculum, env, make_data, seed=seed)
    return RunData(train_data, eval_data, demos, curriculum)


def prompt_data(items: list[dict], tokenizer: Any, cfg: TrainConfig) -> PromptData:
    """`items` tokenised as the resolved `cfg` says (its `model` group; run.seed orders them)."""
    return PromptData(items, tokenizer, cfg.model, seed=cfg.run.seed)


def resume(cfg: TrainConfig, runtime: Runtime, data: BatchSource, logger: MetricsLogger) -> int:
    """The step a checkpoint ended (0 when starting fresh); its state is loaded into the roles and the data source
    (the sampler, or the demonstrations of algorithm=sft)."""
    ckpt = checkpoint.resolve_resume(cfg.run.resume, cfg.run_dir)
    if ckpt is None:
        if cfg.run.resume == "auto":
            # the rows a run wrote before it was stopped without a checkpoint are lost work: the run starts over
            dropped = logger.drop_after(-1)
            print(
                f"run.resume=auto: no checkpoint in {cfg.run_dir / checkpoint.CHECKPOINTS}, starting at step 1"
                + (f" ({dropped} rows of metrics.jsonl from before dropped)" if dropped else ""),
                flush=True,
            )
        return 0
    step = checkpoint.restore_run(ckpt, runtime, data)
    logger.drop_after(step)  # rows of steps after the checkpoint were lost work; they are redone
    return step


def prepare(
    cfg: TrainConfig, runtime: Runtime, tokenizer: Any, batch: Batch, step: int, logger: MetricsLogger
) -> tuple[list[TrainSample], dict]:
    """Reward shaping (KL in the reward, overlong penalty) -> advantages -> loss masks -> top-k, the batch's
    metrics, and the step's rollout dump (logger.rollouts_interval; with wandb also its `rollouts` table)."""
    a, budget = cfg.algorithm, cfg.completion_tokens
    shaped, kl_metrics = kl_reward_penalty(runtime.reference_logprobs, batch.rollouts, batch.rewards, a)
    token_adv, distill_metrics = distill_advantages(runtime.teacher_logprobs, batch.rollouts, a)  # distill
    samples, adv, metrics = prepare_samples(batch.rollouts, shaped, a, budget, token_adv)
    every = cfg.logger.rollouts_interval
    if every and step % every == 0:
        path = Path(cfg.logger.rollouts_dir) / f"{checkpoint.step_dir_name(step)}.jsonl"  # type: ignore[arg-type]  # resolved
        rows = evaluation.save_rollouts(path, step, tokenizer, batch.rollouts, batch.rewards, shaped, adv, a, budget)
        logger.log_table(step, "rollouts", rows)
    behind = [runtime.steps_behind(r.adapter_version) for r in batch.rollouts]
    return samples, {
        **kl_metrics,
        **distill_metrics,
        **rollout_metrics(batch.rollouts, batch.rewards, adv, cfg.algorithm.group_size, cfg.eval.correct_threshold),
        **batch.stats,
        **metrics,
        **runtime.pop_counts(),
        "async/staleness_mean": float(np.mean(behind)),
        "async/staleness_max": float(max(behind)),
        "actor/adapter_version": float(min(r.adapter_version for r in batch.rollouts)),
        "data/learner_generated_frac": float(np.mean([r.actor < 0 for r in batch.rollouts])),
    }


def learn(
    runtime: Runtime, samples: list[TrainSample], updates: int, while_waiting: Callable[[], None] | None = None
) -> dict[str, float]:
    """`updates` optimizer steps over consecutive mini-batches of the step's samples (PPO-style; each mini-batch
    is normalised on its own); metrics are averaged, times summed. The ratio stays against the behaviour policy.
    `while_waiting` is called in a loop until each step is done (a continuous rollout's pump)."""
    chunks = [c for c in shard(samples, updates) if c]
    results = []
    for chunk in chunks:
        pending = runtime.submit_train_step(chunk)
        # the learners' step is waited on in slices, the actors fed between them (a 2-core machine feels a busier poll)
        while while_waiting is not None and not runtime.train_step_done(pending, timeout_s=0.05):
            while_waiting()
        results.append(runtime.finish_train_step(pending))
    out = {k: float(np.mean([r[k] for r in results])) for k in results[0]}
    out["time/learn_s"] = float(sum(r["time/learn_s"] for r in results))
    out["train/optimizer_steps"] = float(len(chunks))
    return out


def throughput(m: dict[str, float], samples: list[TrainSample], step_s: float) -> dict[str, float]:
    """The step's time and rates per second of the step, whatever the rollout mode: samples trained, and tokens the
    actors generated (the learners' own rate, over their busy time, is perf/learner_tokens_per_s)."""
    return {
        "time/step_s": step_s,
        "perf/samples_per_s": len(samples) / max(step_s, 1e-9),
        "perf/actor_tokens_per_s": m.get("data/generated_tokens", 0.0) / max(step_s, 1e-9),
    }


def log_eval(evaluate: Callable[[int], dict[str, float]], logger: MetricsLogger, *, step: int) -> float | None:
    """Evaluate (`evaluate(step)`: evaluation.evaluate, wired), log (the evaluation before training also on the
    console) and return the accuracy."""
    metrics = evaluate(step)
    if not metrics:
        return None
    logger.log(step, metrics)
    if step == 0:
        logger.console(step, metrics)
    return metrics["eval/accuracy"]


def count_nonfinite(metrics: dict[str, float], in_a_row: int, step: int, cfg: TrainConfig) -> int:
    """Steps in a row whose loss was NaN/inf (the learner skipped their optimizer step); says so on the console."""
    if not metrics["train/skipped_nonfinite"]:
        return 0
    in_a_row += 1
    print(
        f"step {step}: non-finite loss ({metrics['train/loss']}), optimizer step skipped ({in_a_row} in a row; the "
        f"run stops at run.max_nonfinite_steps={cfg.run.max_nonfinite_steps})",
        flush=True,
    )
    return in_a_row


def nonfinite_reason(n: int, step: int, cfg: TrainConfig) -> str:
    return (
        f"{n} steps in a row had a non-finite loss (NaN/inf; run.max_nonfinite_steps={cfg.run.max_nonfinite_steps}), "
        f"stopped after step {step}; check the reward for NaN/inf or lower algorithm.lr"
    )


def stop_message(reason: str, run_dir: Path) -> str:
    last = checkpoint.latest(run_dir)
    where = f"last checkpoint: {last}" if last else "no checkpoint was saved yet (checkpoint.interval)"
    return f"{reason}; {where}; resume with: python train.py run.resume=auto run.output_dir={run_dir} (same overrides)"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
