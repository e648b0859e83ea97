"""Assemble a run from its resolved config: tokenizer, logger, the roles (in this process or as Ray actors); run
the loop; tear everything down whatever happens. A role that fails to start is explained here, by
rl/preflight/diagnose.py (the training loop itself never imports the preflight package).

The roles' one wiring point: each role's constructor arguments (`learner_args`, `rollout_args`, `teacher_args`) and
process environment are read from the resolved `TrainConfig` here, and only those small objects cross into the
roles' processes (the loop's wiring point is rl/loop/driver.py `train`)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rewards.protocol import RewardFn, needs_judge
from rl.config.choices import ClusterMode, LearnerBackend, RolloutBackend
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
    # the teardown, written once: closed in reverse order of registration, whatever happens and wherever it stops
    with contextlib.ExitStack() as stack:
        stack.callback(logger.close)  # last
        roles = stack.enter_context(contextlib.ExitStack())  # the roles' teardown, once they exist
        # the roles' warnings and errors on the console (every line from their start on with run.verbose=true);
        # stopped first, so that the roles' shutdown chatter stays in their files
        follower = LogFollower(cfg.log_dir, verbose)
        stack.callback(follower.stop)
        if verbose:
            follower.start()
        try:
            runtime, teardown = build_runtime(cfg)
        except RoleStartFailed as e:  # its cause in one line, with the key that fixes it (RayStartError is one already)
            raise StartupError(explain(e.role, e.cause, cfg)) from e
        roles.callback(teardown)
        bind_judge(cfg, runtime, teacher_tokenizer, reward_fn)
        if not verbose:
            follower.start()  # from here on: what the roles print while they run, their start-up chatter left out
        summary = train(cfg, runtime, tokenizer, env, reward_fn, logger, resolved, run_data)
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


# ------------------------------------------------------------------------------------------------ the roles' wiring
# Each role takes the config groups and named values it uses; what it needs of the whole config is read here, once.


def learner_args(cfg: TrainConfig) -> dict[str, Any]:
    """rl.learner.Learner's constructor arguments from the resolved `cfg`."""
    return dict(
        model=cfg.model,
        algorithm=cfg.algorithm,
        learner=cfg.learner,
        seed=cfg.run.seed,
        max_seq_length=cfg.max_seq_length,
        sync_dtype=cfg.sync_dtype,
        deterministic=cfg.run.deterministic,
        threads=cfg.cluster.learner_threads,
        colocate=cfg.cluster.colocate,
    )


def rollout_args(cfg: TrainConfig) -> dict[str, Any]:
    """The constructor arguments of the rollout engine `cluster.rollout_backend` names (rl.rollout.rollout_class)."""
    if cfg.cluster.rollout_backend == RolloutBackend.hf:
        return dict(model=cfg.model, seed=cfg.run.seed, episodes=cfg.episodes)
    return dict(
        model=cfg.model,
        cluster=cfg.cluster,
        max_seq_length=cfg.max_seq_length,
        seed=cfg.run.seed,
        deterministic=cfg.run.deterministic,
        episodes=cfg.episodes,
    )


def teacher_args(cfg: TrainConfig) -> dict[str, Any]:
    """rl.rollout.teacher.TeacherEngine's constructor arguments: the teacher's own `model` and `cluster` groups
    (rl/resolve.py teacher_engine_config) and its adapter."""
    from rl.resolve import teacher_engine_config

    t = teacher_engine_config(cfg)
    return dict(
        model=t.model,
        cluster=t.cluster,
        max_seq_length=t.max_seq_length,
        seed=cfg.run.seed,
        adapter=cfg.teacher.adapter,
    )


def role_envs(cfg: TrainConfig) -> dict[str, dict[str, str]]:
    """The environment of each role's process (rl/runtime/process_env.py): "actor" (and judge/teacher), "learner"."""
    from rl.runtime import process_env

    deterministic = cfg.run.deterministic
    return {
        "actor": process_env.actor_env(
            use_gpu=cfg.cluster.use_gpu, threads=cfg.cluster.actor_threads, deterministic=deterministic
        ),
        "learner": process_env.learner_env(
            unsloth=cfg.model.learner_backend == LearnerBackend.unsloth, deterministic=deterministic
        ),
    }


# In a job thread of a pack (rl/pack.py), the function that hands the job its view of the pack's shared roles
_pack = threading.local()


def join_pack(join: Callable[[TrainConfig], tuple[Runtime, Callable[[], None]]] | None) -> None:
    """Make this thread a job of a pack: its `build_runtime` joins the pack (`join(cfg)`) instead of starting roles."""
    _pack.join = join


def build_runtime(
    cfg: TrainConfig, pack: list[TrainConfig] | None = None, log_dir: Path | None = None
) -> tuple[Runtime, Callable[[], None]]:
    """Create the roles (in this process, or as Ray actors); returns the runtime and a function that tears it down.
    `pack`: the resolved configs of a pack's jobs (rl/pack.py; `cfg` is the first): one learner and one engine per
    role serve them all (rl/runtime/packed.py), set up per job from each job's own arguments, their logs in
    `log_dir` (the pack's, not a job's; default: the run's logs/)."""
    join = getattr(_pack, "join", None)
    if join is not None and pack is None:
        return join(cfg)
    from rl.learner import Learner
    from rl.rollout import rollout_class

    c, envs, episodes = cfg.cluster, role_envs(cfg), cfg.episodes is not None
    log_dir = log_dir or cfg.log_dir
    learner_cls: type = Learner
    rollout_cls: type = rollout_class(c.rollout_backend)
    learner_kw, rollout_kw = learner_args(cfg), rollout_args(cfg)
    if pack is not None:
        from rl.runtime.packed import PackedRole

        slots = {"lora_slots": len(pack)} if c.rollout_backend == RolloutBackend.vllm else {}
        learner_kw = dict(cls=learner_cls, jobs=[learner_args(x) for x in pack])
        rollout_kw = dict(cls=rollout_cls, jobs=[rollout_args(x) | slots for x in pack])
        learner_cls = rollout_cls = PackedRole
    if c.mode == ClusterMode.local:
        from rl.runtime.process_env import deterministic_env

        os.environ.update(envs["actor"] | deterministic_env(cfg.run.deterministic))
        prepare_actor_base(cfg, remote=False)
        if not cfg.run.verbose:  # the roles share the driver's console here: vLLM's own INFO lines are left out
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if cfg.model.learner_backend == LearnerBackend.unsloth:  # too late to come first here (torch is loaded)
            import unsloth  # noqa: F401 - models.py warns
        learner = start_role("learner 0", learner_cls, learner_kw)
        rollout = start_role("rollout actor 0", rollout_cls, rollout_kw)
        teachers = None
        if c.num_teachers:
            from rl.rollout.teacher import TeacherEngine

            teachers = LocalGroup([start_role("judge/teacher 0", TeacherEngine, teacher_args(cfg))])
        runtime = Runtime(LocalGroup([rollout]), LocalGroup([learner]), c, teachers, episodes=episodes)
        return runtime, runtime.close

    from rl.runtime import placement
    from rl.runtime.placement import Role

    gpus = (c.gpus_needed, c.gpus_per_role_max) if c.use_gpu else (0.0, 0.0)  # what a SLURM job must hold
    started = placement.start_ray(c.address, c.ray_num_cpus, cfg.run.verbose, log_dir=log_dir, gpus=gpus)
    try:
        prepare_actor_base(cfg, remote=True)
        teacher = None
        if c.num_teachers:
            from rl.rollout.teacher import TeacherEngine

            teacher = Role(TeacherEngine, teacher_args(cfg), envs["actor"])
        runtime = placement.build_ray_runtime(
            c,
            log_dir,
            rollout=Role(rollout_cls, rollout_kw, envs["actor"]),
            learner=Role(learner_cls, learner_kw, envs["learner"]),
            teacher=teacher,
            episodes=episodes,
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
    from rl.model_path import dequantized_folder

    m = cfg.model
    made_here = m.load_in_4bit and m.actor_path == str(dequantized_folder(m))  # not a folder the user gave
    if not made_here or (Path(m.actor_path) / "config.json").is_file():  # type: ignore[arg-type]  # resolved
        return
    from rl.learner.quantized_base import dequantized_base

    print(f"making the 4-bit learner's base for the actors (once): {m.actor_path}", flush=True)
    values = dict(max_seq_length=cfg.max_seq_length, seed=cfg.run.seed)
    try:
        if not remote:
            dequantized_base(m, **values)
            return
        from rl.runtime import placement

        c = cfg.cluster
        env = role_envs(cfg)["learner"]  # Unsloth first in that process too
        gpus = min(1.0, c.gpus_per_learner)
        placement.run_task(dequantized_base, m, gpus=gpus, cpus=c.cpus_per_learner, env=env, **values)
    except Exception as e:
        raise RoleStartFailed("the 4-bit learner's base for the actors (model.actor_base=learner)", cause_of(e)) from e


def start_role(role: str, cls: Callable[..., R], kwargs: dict[str, Any]) -> R:
    """A role built in this process (cluster.mode=local); a failed constructor becomes RoleStartFailed, as a Ray
    actor's does in rl/runtime/placement.py."""
    try:
        return cls(**kwargs)
    except Exception as e:
        raise RoleStartFailed(role, cause_of(e)) from e
