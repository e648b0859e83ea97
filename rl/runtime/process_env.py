"""The environment of each role's process, set before its first import: what rl/runtime/placement.py starts a Ray
actor with, and what rl/app.py puts in the driver's own environment when the roles run there (cluster.mode=local).
Each function takes the settings it reads, as named values."""

from __future__ import annotations

import os


def actor_env(*, use_gpu: bool, threads: int | None, deterministic: bool) -> dict[str, str]:
    """Environment of a rollout actor's process: the driver's VLLM_* settings (they reach actors on other nodes
    too), on CPU (`use_gpu` false) the cores its vLLM engine may use (`threads`: cluster.actor_threads) and its engine
    core in the actor's process, and with `deterministic` (run.deterministic) on GPUs vLLM's batch-invariant mode
    (vLLM >= 0.11 reads VLLM_BATCH_INVARIANT in its GPU worker; the CPU build has no such mode).

    Why in-process on CPU: vLLM CPU's numerics depend on which requests share a step, so a seeded sample can change
    with its batch-mates (docs/benchmarks.md, "Reproducible runs"). An engine core in its own process starts stepping
    as soon as the first request of a `generate` reaches it, so its first batches depend on timing; in the actor's
    process `generate` adds every request before the first step and the batches follow from the prompts alone. A
    VLLM_ENABLE_V1_MULTIPROCESSING set in the driver's environment wins."""
    from rl.rollout.vllm import cpu_threads_env

    env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    if not use_gpu:
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} | env | cpu_threads_env(threads)
    return env | ({"VLLM_BATCH_INVARIANT": "1"} if deterministic else {})


def learner_env(*, unsloth: bool, deterministic: bool) -> dict[str, str]:
    """Environment of a learner's process: with the Unsloth backend (`unsloth`), Unsloth must be its first ML import
    (rl/__init__.py reads RLFT_IMPORT_UNSLOTH)."""
    env = {"RLFT_IMPORT_UNSLOTH": "1"} if unsloth else {}
    return env | deterministic_env(deterministic)


def deterministic_env(deterministic: bool) -> dict[str, str]:
    """With `run.deterministic=true`, cuBLAS's fixed workspace: torch.use_deterministic_algorithms needs it on
    CUDA, and cuBLAS reads it only when it starts."""
    return {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if deterministic else {}
