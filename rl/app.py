"""Assemble a run from its resolved config: tokenizer, logger, the roles (in this process or as Ray actors); run
the loop; tear everything down whatever happens. A role that fails to start is explained here, by
rl/preflight/diagnose.py (the training loop itself never imports the preflight package)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from rewards.protocol import RewardFn, needs_judge
from rl.config.choices import ClusterMode
from rl.config.schema import TrainConfig
from rl.errors import RoleStartFailed, StartupError, cause_of
from rl.logs import LogFollower
from rl.preflight.diagnose import explain
from rl.runtime.groups import LocalGroup
from rl.runtime.roles import R
from rl.runtime.runtime import Runtime

log = logging.getLogger(__name__)


def run(cfg: TrainConfig, *, env: Any, reward_fn: RewardFn, resolved: dict) -> dict[str, float]:
    """Train as the resolved `cfg` says; returns the summary. `resolved` is the config as plain data (logged)."""
    import transformers
    from transformers import AutoTokenizer

    from rl.loop.checkpoint import finished_summary
    from rl.loop.driver import load_data, train
    from rl.metrics import MetricsLogger
    from rl.runtime.placement import RayStartError

    t0 = time.perf_counter()
    done = finished_summary(cfg.run.resume, cfg.run_dir, cfg.run.steps)
    if done is not None:  # starting the roles would only evaluate again and overwrite the run's summary
        print(
            f"run.resume={cfg.run.resume}: {cfg.run_dir} has trained its run.steps={cfg.run.steps} steps and finished; "
            "nothing to do (raise run.steps to train it further)",
            flush=True,
        )
        return done
    if not cfg.run.verbose:  # the driver's transformers only tokenises: its notices on tokenizer configs
        transformers.logging.set_verbosity_error()  # (e.g. "Ignoring clean_up_tokenization_spaces") stay out
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    except Exception as e:
        raise StartupError(explain("the tokenizer", cause_of(e), cfg, "did not load")) from e
    teacher_tokenizer = check_teacher(cfg, tokenizer, reward_fn)  # before anything starts
    run_data = load_data(cfg, tokenizer, env)
    lg = cfg.logger
    logger = MetricsLogger(
        cfg.run_dir,
        kind=lg.kind.value,
        wandb_mode=lg.mode.value,
        project=lg.project,
        name=lg.name,
        group=lg.group,
        tags=lg.tags,
        config=resolved,
        console_every=lg.console_every,
        total_steps=cfg.run.steps,
    )
    c, verbose, a = cfg.cluster, cfg.run.verbose, cfg.algorithm
    per_step = f"{a.group_size} samples" if a.demos is None else f"1 demonstration ({a.demos})"
    start = f"\nstarting from the adapter {cfg.model.init_adapter}" if cfg.model.init_adapter else ""
    print(
        f"run dir: {cfg.run_dir}\nmodel: {cfg.model.path}{start}\n{c.mode.value}: {c.num_actors} rollout actor(s), "
        f"{c.num_learners} learner(s); algorithm {a.name}; {cfg.run.steps} steps x {cfg.run.prompts_per_step} prompts x "
        f"{per_step}",
        flush=True,
    )
    # the roles' warnings and errors on the console (every line from their start on with run.verbose=true)
    follower = LogFollower(cfg.log_dir, verbose)
    if verbose:
        follower.start()
    try:
        runtime, teardown = build_runtime(cfg)
    except RayStartError:  # a UserFacingError already: one line naming the key to change
        follower.stop()
        logger.close()
        raise
    except RoleStartFailed as e:  # its cause in one line, with the key that fixes it
        follower.stop()
        logger.close()
        raise StartupError(explain(e.role, e.cause, cfg)) from e
    except BaseException:
        follower.stop()
        logger.close()
        raise
    try:
        bind_judge(cfg, runtime, teacher_tokenizer, reward_fn)
    except BaseException:
        follower.stop()
        teardown()
        logger.close()
        raise
    if not verbose:
        follower.start()  # from here on: what the roles print while they run, their start-up chatter left out
    try:
        summary = train(cfg, runtime, tokenizer, env, reward_fn, logger, resolved, run_data)
    finally:
        follower.stop()  # before the teardown: the roles' shutdown chatter stays in their files
        teardown()
        logger.close()
    summary["time/total_s"] = time.perf_counter() - t0
    line = accuracy_line(summary, len(run_data.eval))
    if line is not None:
        print(line, flush=True)
    return summary


def accuracy_line(summary: dict[str, float], prompts: int) -> str | None:
    """The run's last console line: held-out accuracy before and after, on the `prompts` evaluated (eval/n, which
    an env's smaller eval set or prompts over model.max_prompt_tokens make fewer than eval.size); None without both."""
    before, after = summary.get("eval/accuracy_before"), summary.get("eval/accuracy_after")
    if before is None or after is None:
        return None
    return (
        f"held-out accuracy (greedy, {prompts} prompts): before {before:.3f} -> after {after:.3f} "
        f"({after - before:+.3f}); total {summary['time/total_s']:.0f} s"
    )


def check_teacher(cfg: TrainConfig, tokenizer: Any, reward_fn: RewardFn) -> Any:
    """Before any role starts: a judge reward needs a judge engine, and a distillation teacher the student's
    tokenizer. Returns the teacher's tokenizer (None without a judge/teacher engine)."""
    from transformers import AutoTokenizer

    from rl.config.errors import ConfigError
    from rl.rollout.teacher import check_same_tokenizer

    if needs_judge(reward_fn) and not cfg.cluster.num_teachers:
        raise ConfigError("reward=judge asks a judge model: set cluster.num_teachers=1 (teacher.path: its model)")
    if not cfg.cluster.num_teachers:
        return None
    path = cfg.teacher.path or cfg.model.path  # resolved: null is the student's model as the actors serve it
    same = path in (cfg.model.path, cfg.model.actor_path)  # the actors' base is made later; its tokenizer is ours
    theirs = tokenizer if same else AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
    if cfg.algorithm.distill_coef > 0 and not same:
        check_same_tokenizer(tokenizer, theirs, cfg.model.path, path)
    return theirs


def bind_judge(cfg: TrainConfig, runtime: Runtime, teacher_tokenizer: Any, reward_fn: RewardFn) -> None:
    """Hand a judge reward the run's judge engines (rewards/judge.py talks text, rl/rollout/judge.py tokenises)."""
    if teacher_tokenizer is None or not needs_judge(reward_fn):
        return
    from rl.rollout.judge import JudgeClient

    t = cfg.teacher
    reward_fn.bind_judge(
        JudgeClient(
            runtime.teacher_generate,
            teacher_tokenizer,
            max_prompt_tokens=t.max_prompt_tokens,
            max_new_tokens=t.max_new_tokens,
            chat=cfg.model.use_chat_template,
        )
    )


def build_runtime(cfg: TrainConfig) -> tuple[Runtime, Callable[[], None]]:
    """Create the roles (in this process, or as Ray actors); returns the runtime and a function that tears it down."""
    from rl.learner import Learner
    from rl.rollout import rollout_class

    c = cfg.cluster
    if c.mode == ClusterMode.local:
        os.environ.update(actor_env(cfg) | deterministic_env(cfg))
        prepare_actor_base(cfg, remote=False)
        if not cfg.run.verbose:  # the roles share the driver's console here: vLLM's own INFO lines are left out
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if cfg.model.learner_backend == "unsloth":  # too late to come first here (torch is loaded); models.py warns
            import unsloth  # noqa: F401
        learner = start_role("learner 0", Learner, cfg)
        rollout = start_role("rollout actor 0", rollout_class(cfg), cfg)
        teachers = None
        if c.num_teachers:
            from rl.rollout.teacher import TeacherEngine

            teachers = LocalGroup([start_role("judge/teacher 0", TeacherEngine, cfg)])
        runtime = Runtime(LocalGroup([rollout]), LocalGroup([learner]), cfg, teachers)
        return runtime, runtime.close

    from rl.runtime import placement

    gpus = (c.gpus_needed, c.gpus_per_role_max) if c.use_gpu else (0.0, 0.0)  # what a SLURM job must hold
    started = placement.start_ray(c.address, c.ray_num_cpus, cfg.run.verbose, log_dir=cfg.log_dir, gpus=gpus)
    try:
        prepare_actor_base(cfg, remote=True)
        teacher = None
        if c.num_teachers:
            from rl.rollout.teacher import TeacherEngine

            teacher = (TeacherEngine, actor_env(cfg))
        runtime = placement.build_ray_runtime(
            cfg, rollout=(rollout_class(cfg), actor_env(cfg)), learner=(Learner, learner_env(cfg)), teacher=teacher
        )
    except BaseException:
        placement.stop_ray(started)
        raise

    def teardown() -> None:
        runtime.close()
        placement.stop_ray(started)

    return runtime, teardown


def prepare_actor_base(cfg: TrainConfig, *, remote: bool) -> None:
    """Beside a 4-bit learner (model.actor_base=learner) the actors load its NF4 base dequantized
    (`model.actor_path`, rl/learner/quantized_base.py): made here once, in a GPU process that loads the model as the
    learner does, before any role starts (the engines measure free GPU memory while they start). Cached after."""
    from pathlib import Path

    from rl.model_path import dequantized_folder

    m = cfg.model
    made_here = m.load_in_4bit and m.actor_path == str(dequantized_folder(cfg))  # not a folder the user gave
    if not made_here or (Path(m.actor_path) / "config.json").is_file():  # type: ignore[arg-type]  # resolved
        return
    from rl.learner.quantized_base import dequantized_base

    print(f"making the 4-bit learner's base for the actors (once): {m.actor_path}", flush=True)
    try:
        if not remote:
            dequantized_base(cfg)
            return
        from rl.runtime import placement

        c = cfg.cluster
        env = learner_env(cfg)  # Unsloth first in that process too
        placement.run_task(dequantized_base, cfg, gpus=min(1.0, c.gpus_per_learner), cpus=c.cpus_per_learner, env=env)
    except Exception as e:
        raise RoleStartFailed("the 4-bit learner's base for the actors (model.actor_base=learner)", cause_of(e)) from e


def start_role(role: str, cls: Callable[[TrainConfig], R], cfg: TrainConfig) -> R:
    """A role built in this process (cluster.mode=local); a failed constructor becomes RoleStartFailed, as a Ray
    actor's does in rl/runtime/placement.py."""
    try:
        return cls(cfg)
    except Exception as e:
        raise RoleStartFailed(role, cause_of(e)) from e


def actor_env(cfg: TrainConfig) -> dict[str, str]:
    """Environment of a rollout actor's process: the driver's VLLM_* settings (they reach actors on other nodes
    too), on CPU the cores its vLLM engine may use and its engine core in the actor's process, and with
    `run.deterministic=true` on GPUs vLLM's batch-invariant mode (vLLM >= 0.11 reads VLLM_BATCH_INVARIANT in its
    GPU worker; the CPU build has no such mode).

    Why in-process on CPU: vLLM CPU's numerics depend on which requests share a step, so a seeded sample can change
    with its batch-mates (docs/benchmarks.md, "Reproducible runs"). An engine core in its own process starts stepping
    as soon as the first request of a `generate` reaches it, so its first batches depend on timing; in the actor's
    process `generate` adds every request before the first step and the batches follow from the prompts alone. A
    VLLM_ENABLE_V1_MULTIPROCESSING set in the driver's environment wins."""
    from rl.rollout.vllm import cpu_threads_env

    env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    if not cfg.cluster.use_gpu:
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} | env | cpu_threads_env(cfg.cluster.actor_threads)
    return env | ({"VLLM_BATCH_INVARIANT": "1"} if cfg.run.deterministic else {})


def learner_env(cfg: TrainConfig) -> dict[str, str]:
    """Environment of a learner's process: Unsloth must be its first ML import (rl/__init__.py reads this)."""
    env = {"RLFT_IMPORT_UNSLOTH": "1"} if cfg.model.learner_backend == "unsloth" else {}
    return env | deterministic_env(cfg)


def deterministic_env(cfg: TrainConfig) -> dict[str, str]:
    """With `run.deterministic=true`, cuBLAS's fixed workspace: torch.use_deterministic_algorithms needs it on
    CUDA, and cuBLAS reads it only when it starts."""
    return {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if cfg.run.deterministic else {}
