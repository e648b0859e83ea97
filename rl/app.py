"""Assemble a run from its specs: tokenizer, logger, the roles (in this process or as Ray actors); run the loop;
tear everything down whatever happens."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from rl.preflight import diagnose as startup
from rl.config.schema import ClusterMode
from rl.runtime.groups import LocalGroup
from rl.logs import LogFollower
from rl.runtime.pool import Runtime
from rl.config.resolve import LearnerSpec, PlacementSpec, RunSpec
from rl.preflight.diagnose import StartupError

log = logging.getLogger(__name__)


def run(spec: RunSpec, *, env: Any, reward_fn: Any, resolved: dict, logger_spec: Any) -> dict[str, float]:
    """Train as `spec` says; returns the summary. `logger_spec` is the typed `logger` config group."""
    import transformers
    from transformers import AutoTokenizer

    from rl.driver import train
    from rl.metrics import MetricsLogger
    from rl.runtime.placement import RayStartError

    t0 = time.perf_counter()
    if not spec.placement.verbose:  # the driver's transformers only tokenises: its notices on tokenizer configs
        transformers.logging.set_verbosity_error()  # (e.g. "Ignoring clean_up_tokenization_spaces") stay out
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.model_path, trust_remote_code=spec.trust_remote_code)
    except Exception as e:
        raise StartupError(startup.explain("the tokenizer", startup.cause_of(e), spec, "did not load")) from e
    lg = logger_spec
    logger = MetricsLogger(
        spec.run_dir,
        kind=lg.kind.value,
        wandb_mode=lg.mode.value,
        project=lg.project,
        name=lg.name,
        group=lg.group,
        tags=lg.tags,
        config=resolved,
        console_every=lg.console_every,
        total_steps=spec.steps,
    )
    p, sampling = spec.placement, spec.sampler.sampling
    print(
        f"run dir: {spec.run_dir}\nmodel: {spec.model_path}\n{p.mode.value}: {p.num_actors} rollout actor(s), "
        f"{p.num_learners} learner(s); algorithm {resolved.get('algorithm', {}).get('name')}; {spec.steps} steps x "
        f"{spec.sampler.prompts_per_step} prompts x {sampling.n} samples",
        flush=True,
    )
    # the roles' warnings and errors on the console (every line from their start on with verbose=true)
    follower = LogFollower(p.log_dir, p.verbose)
    if p.verbose:
        follower.start()
    try:
        runtime, teardown = build_runtime(spec)
    except RayStartError:  # a UserFacingError already: one line naming the key to change
        follower.stop()
        logger.close()
        raise
    except startup.RoleStartFailed as e:  # its cause in one line, with the key that fixes it
        follower.stop()
        logger.close()
        raise StartupError(startup.explain(e.role, e.cause, spec)) from e
    except BaseException:
        follower.stop()
        logger.close()
        raise
    if not p.verbose:
        follower.start()  # from here on: what the roles print while they run, their start-up chatter left out
    try:
        summary = train(spec, runtime, tokenizer, env, reward_fn, logger, resolved)
    finally:
        follower.stop()  # before the teardown: the roles' shutdown chatter stays in their files
        teardown()
        logger.close()
    summary["time/total_s"] = time.perf_counter() - t0
    before, after = summary.get("eval/accuracy_before"), summary.get("eval/accuracy_after")
    if before is not None and after is not None:
        print(
            f"held-out accuracy (greedy, {spec.eval.size} prompts): before {before:.3f} -> after {after:.3f} "
            f"({after - before:+.3f}); total {summary['time/total_s']:.0f} s",
            flush=True,
        )
    return summary


def build_runtime(spec: RunSpec) -> tuple[Runtime, Callable[[], None]]:
    """Create the roles (in this process, or as Ray actors); returns the runtime and a function that tears it down."""
    from rl.learner import Learner
    from rl.rollout import rollout_class

    p = spec.placement
    if p.mode == ClusterMode.local:
        os.environ.update(actor_env(p) | deterministic_env(spec.learner))
        if not p.verbose:  # the roles share the driver's console here: vLLM's own INFO lines are left out
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if spec.learner.backend == "unsloth":  # too late to come first here (torch is loaded); models.py warns
            import unsloth  # noqa: F401
        learner = start_role("learner 0", Learner, spec.learner)
        rollout = start_role("rollout actor 0", rollout_class(spec.rollout), spec.rollout)
        runtime = Runtime(LocalGroup([rollout]), LocalGroup([learner]), spec.runtime)
        return runtime, runtime.close

    from rl.runtime import placement

    started = placement.start_ray(p.address, p.ray_num_cpus, p.verbose)
    try:
        runtime = placement.build_ray_runtime(
            p,
            spec.runtime,
            rollout=(rollout_class(spec.rollout), spec.rollout, actor_env(p)),
            learner=(Learner, spec.learner, learner_env(spec.learner)),
        )
    except BaseException:
        placement.stop_ray(started)
        raise

    def teardown() -> None:
        runtime.close()
        placement.stop_ray(started)

    return runtime, teardown


def start_role(role: str, cls: type, role_spec: Any) -> Any:
    """A role built in this process (cluster.mode=local); a failed constructor becomes RoleStartFailed, as a Ray
    actor's does in rl/runtime/placement.py."""
    try:
        return cls(role_spec)
    except Exception as e:
        raise startup.RoleStartFailed(role, startup.cause_of(e)) from e


def actor_env(placement: PlacementSpec) -> dict[str, str]:
    """Environment of a rollout actor's process: the driver's VLLM_* settings (they reach actors on other nodes
    too), on CPU the cores its vLLM engine may use and its engine core in the actor's process, and with
    `deterministic=true` on GPUs vLLM's batch-invariant mode (vLLM >= 0.11 reads VLLM_BATCH_INVARIANT in its GPU
    worker; the CPU build has no such mode).

    Why in-process on CPU: vLLM CPU's numerics depend on which requests share a step, so a seeded sample can change
    with its batch-mates (docs/benchmarks.md, "Reproducible runs"). An engine core in its own process starts stepping
    as soon as the first request of a `generate` reaches it, so its first batches depend on timing; in the actor's
    process `generate` adds every request before the first step and the batches follow from the prompts alone. A
    VLLM_ENABLE_V1_MULTIPROCESSING set in the driver's environment wins."""
    from rl.rollout.vllm import cpu_threads_env

    env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    if not placement.use_gpu:
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} | env | cpu_threads_env(placement.actor_threads)
    return env | ({"VLLM_BATCH_INVARIANT": "1"} if placement.deterministic else {})


def learner_env(learner: LearnerSpec) -> dict[str, str]:
    """Environment of a learner's process: Unsloth must be its first ML import (rl/__init__.py reads this)."""
    env = {"RLFT_IMPORT_UNSLOTH": "1"} if learner.backend == "unsloth" else {}
    return env | deterministic_env(learner)


def deterministic_env(learner: LearnerSpec) -> dict[str, str]:
    """With `deterministic=true`, cuBLAS's fixed workspace: torch.use_deterministic_algorithms needs it on CUDA,
    and cuBLAS reads it only when it starts."""
    return {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if learner.deterministic else {}
