"""The one resolve step: the validated config in, the same config out with every `auto`/`null` filled.

`resolve(cfg, run_dir)` fills the learner backend, the dtypes, the learning rate, the LoRA mode, a CPU run's threads
per role where its roles overlap, the packed-row budget, the loss normaliser, the overlong buffer, the output folders,
`model.path` (an embedded model converted once), the weights the actors load (`model.actor_path`: beside a 4-bit learner its NF4 base dequantized) and the
multi-turn episode limits (`episodes`, from `env`); it checks the registry names (advantage, policy loss,
aggregation) and that a run writes only into a folder of its own (check_run_dir_is_new). It returns a new
`TrainConfig` (`dataclasses.replace`); the wiring points (rl/app.py for the roles, rl/loop/driver.py for the loop)
hand each part the groups and values it uses. A setting is declared once, in rl/config/, and read where it is used.
`teacher_engine_config` derives the judge/teacher engine's `model` and `cluster` from it the same way.

Above what it reads (checkpoints, filters, algorithms, model paths): nothing below it imports it.

Import-light at module level (no torch, no vllm, no ray): the preflight plan resolves with it too.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import replace
from pathlib import Path

from rl.config.choices import ActorBase, DType, LearnerBackend, LoraMode, RolloutMode, WeightSync
from rl.config.schema import ConfigError, TrainConfig
from rl.config.teacher import TeacherConfig
from rl.model_path import adapter_lora
from rl.types import EpisodeSpec

# auto's packed row with the PEFT backend. CPU: at the demo's batch (64 sequences of 67-97 tokens, 8 prompts shared)
# packed rows with the shared prompt step 1.57x faster than padded micro-batches of 16, and 1.38-1.74x at 20-1000-token
# completions. GPU: a small model's step is launch-bound, so fewer and fuller forwards win: at 32 prompts x 8 (20-256
# tokens) on an H200 the learner took 0.5-0.8 s per step in rows of 16384 tokens against 29 s padded with the
# KV-cache prompt (docs/benchmarks.md). Either budget is capped at the padded micro-batch's worst case
# (micro_batch_size x (model.max_prompt_tokens + model.max_new_tokens) tokens), so that auto never asks for more
# activation memory than padding would. Unsloth refuses packed rows;
# `run.deterministic=true` on a GPU stays padded: the deterministic GPU runs were verified padded, and the varlen
# flash backward's determinism is not (flash kernels accumulate the query gradient with atomics unless told otherwise).
CPU_PACKED_TOKENS = 4096
GPU_PACKED_TOKENS = 16384


def resolve_lora_mode(cfg: TrainConfig) -> LoraMode:
    """`cluster.lora_mode` as the actors run it. auto = merged on every device: vLLM's LoRA kernels decode slower
    than merged weights (docs/benchmarks.md: 7.6-9.2x on a 2-core CPU, 0.8x the speed on an H200 at 0.5B) and a
    merged load costs about 0.2 s per version there. Full fine-tuning has no adapter: merged (no LoRA slots). Actors
    that keep the 4-bit learner's base in NF4 (model.actor_base=quantized) cannot merge: native."""
    if cfg.model.full_finetune:
        return LoraMode.merged
    if cfg.cluster.lora_mode == LoraMode.auto:
        quantized = cfg.model.load_in_4bit and cfg.model.actor_base == ActorBase.quantized
        return LoraMode.native if quantized else LoraMode.merged
    return cfg.cluster.lora_mode


def resolve_cpu_threads(cfg: TrainConfig, overlap: bool | None = None, cores: int | None = None) -> dict[str, int]:
    """`cluster.actor_threads` / `learner_threads` left unset (all cores) on a CPU run whose roles compute at the same
    time (`overlap`, by default: cluster.staleness >= 1 or continuous rollouts; a sweep pack always) on a local Ray or
    in-process: the cores (cluster.ray_num_cpus, else `cores`, else this machine's) split evenly among the actors and learners, at least one
    each; by key, only the keys to fill. Roles that each run a thread per core slow each other down: on 2 cores,
    staleness 1 with two actors and a learner took 46.1 s a step with every core per role and 27.5 s with one each,
    and a sweep pack of 4 went from 0.91x to 1.61x the speed of its jobs run one after another (docs/benchmarks.md).
    A synchronous run alternates its roles and keeps every core for each."""
    c = cfg.cluster
    if overlap is None:
        overlap = c.staleness > 0 or c.rollout_mode == RolloutMode.continuous
    if c.use_gpu or c.address is not None or not overlap:
        return {}
    per_role = max(1, (c.ray_num_cpus or cores or os.cpu_count() or 1) // (c.num_actors + c.num_learners))
    return {key: per_role for key in ("actor_threads", "learner_threads") if getattr(c, key) is None}


def resolve_learner_backend(cfg: TrainConfig) -> LearnerBackend:
    """auto = unsloth on GPUs when the package is installed (the fastest 4-bit LoRA path measured), else peft.
    Looks for the package without importing it (its import patches torch)."""
    name = cfg.model.learner_backend
    if name != LearnerBackend.auto:
        return name
    found = cfg.cluster.use_gpu and importlib.util.find_spec("unsloth") is not None
    return LearnerBackend.unsloth if found else LearnerBackend.peft


def resolve_dtype(dtype: DType | str, use_gpu: bool) -> DType:
    """`model.dtype` / `model.learner_dtype` as the roles load the weights: auto = bfloat16 on GPUs (`use_gpu`) and on
    CPUs that compute it natively (`cpu_computes_bf16`), float32 on the others, where bf16 is
    emulated: on an AVX2-only CPU the CPU demo's first step took 461 s in bf16 and 49-53 s in fp32
    (docs/configuration.md). A CPU run is judged by the machine that resolves its config (a remote Ray cluster of
    other CPUs: set the keys)."""
    dtype = DType(dtype)
    if dtype != DType.auto:
        return dtype
    return DType.bfloat16 if use_gpu or cpu_computes_bf16() else DType.float32


@functools.cache
def cpu_computes_bf16() -> bool:
    """Whether torch's CPU kernels compute bf16 natively on this machine (oneDNN's bf16 path: AVX-512 or AMX on x86,
    the bf16 extension on Arm); without it bf16 is emulated, several times slower than fp32."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_micro_batch_tokens(cfg: TrainConfig) -> int:
    """learner.micro_batch_tokens as the learner uses it: the config's value, or for auto (null) with the PEFT
    backend CPU_PACKED_TOKENS on a CPU learner and GPU_PACKED_TOKENS on a GPU one, at most the padded micro-batch's
    worst case; 0 (padded micro-batches) with Unsloth and for deterministic GPU runs."""
    lc = cfg.learner
    if lc.micro_batch_tokens is not None:
        return lc.micro_batch_tokens
    if resolve_learner_backend(cfg) != LearnerBackend.peft or (cfg.cluster.use_gpu and cfg.run.deterministic):
        return 0
    padded = lc.micro_batch_size * (cfg.model.max_prompt_tokens + cfg.model.max_new_tokens)
    return min(GPU_PACKED_TOKENS if cfg.cluster.use_gpu else CPU_PACKED_TOKENS, padded)


# algorithm.lr's default: a LoRA adapter starts at zero and takes large steps (the demo learns chain_sum at 2e-4 in
# 24 steps); a full fine-tune moves every pretrained weight, at the 1e-6 of the full fine-tuning runs in
# docs/benchmarks.md (at the LoRA rate a full fine-tune of SmolLM2 lost most of its held-out accuracy in 2 steps)
LORA_LR, FULL_FINETUNE_LR = 2e-4, 1e-6


def check_registry_names(cfg: TrainConfig) -> None:
    """Unknown advantage / policy loss / aggregation names fail here, before anything starts."""
    from rl import algorithms

    a = cfg.algorithm
    try:
        algorithms.get_advantage(a.advantage)
        algorithms.get_policy_loss(a.policy_loss)
        algorithms.get_loss_agg(a.loss_agg)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None


def episode_spec(cfg: TrainConfig) -> EpisodeSpec | None:
    """The multi-turn env the actors run, when `env._target_` is one (envs/protocol.py is_multi_turn); its limits
    are read from the env config or its constructor's defaults, without building it."""
    env = cfg.env
    if not isinstance(env, dict) or not isinstance(env.get("_target_"), str):
        return None
    from hydra.utils import get_class

    try:
        cls = get_class(env["_target_"])
    except Exception:  # noqa: BLE001 - train.py reports an unknown target when it builds the env
        return None
    from envs.protocol import episode_limits

    try:
        limits = episode_limits(cls, env)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if limits is None:
        return None
    if cfg.cluster.learner_chunk_size:
        raise ConfigError(
            f"cluster.learner_chunk_size={cfg.cluster.learner_chunk_size}: learners generate single turns only, and "
            f"env {env['_target_']} runs multi-turn episodes: set cluster.learner_chunk_size=0"
        )
    return EpisodeSpec(json.dumps(env), *limits, cfg.model.use_chat_template, cfg.model.max_prompt_tokens)


def resolve_actor_path(cfg: TrainConfig) -> str:
    """The weights the actors load: `model.actor_path` as given, else `model.path`, except beside a 4-bit learner
    with `model.actor_base=learner`: its NF4 base dequantized, in the cache (rl/app.py has it made once, on a GPU,
    before the actors start), so that both sides compute with the same base."""
    from rl.model_path import dequantized_folder, resolve_model_path

    m = cfg.model
    if m.actor_path is not None:
        return resolve_model_path(m.actor_path, key="model.actor_path")
    if m.load_in_4bit and m.actor_base == ActorBase.learner:
        return str(dequantized_folder(m))
    return m.path


def resolve_init_adapter(cfg: TrainConfig) -> str | None:
    """`model.init_adapter` as the adapter folder it names (an adapter folder, a run directory or a checkpoint:
    rl/loop/checkpoint.py find_policy), checked against this run's LoRA shape, which the learner must match to load it."""
    m = cfg.model
    if m.init_adapter is None:
        return None
    from rl.loop.checkpoint import find_policy

    policy = find_policy(m.init_adapter, key="model.init_adapter")
    if policy.adapter is None:
        raise ConfigError(
            f"model.init_adapter={m.init_adapter} holds a full model ({policy.model}), not a LoRA adapter: give it "
            "as model.path instead"
        )
    theirs = adapter_lora(policy.adapter)
    ours = (m.lora_rank, m.lora_alpha, sorted(m.lora_targets))
    if theirs != ours:
        raise ConfigError(
            f"model.init_adapter={m.init_adapter} is LoRA rank {theirs[0]}, alpha {theirs[1]} on {theirs[2]}; this "
            f"run's model.lora_rank / lora_alpha / lora_targets are {ours[0]}, {ours[1]}, {ours[2]}: set them to the "
            "adapter's"
        )
    return str(Path(policy.adapter).resolve())


def resolve_teacher(cfg: TrainConfig) -> TeacherConfig:
    """`teacher.path` as the folder its engines load and `teacher.adapter` as the adapter folder it names
    (rl/loop/checkpoint.py find_policy). Untouched when no judge/teacher engine runs (`cluster.num_teachers=0`).

    A null `teacher.path` is the student's model as the actors serve it (`model.actor_path`, resolved first): beside
    a 4-bit learner that is its NF4 base dequantized, the base a `teacher.adapter` from a run of the same config was
    trained on (on SmolLM2 it differs from the bf16 weights by about 0.6 nats per token: the adapter on those would
    be another teacher than the one trained)."""
    t = cfg.teacher
    if cfg.cluster.num_teachers == 0:
        return t
    from rl.model_path import resolve_model_path

    path = cfg.model.actor_path if t.path is None else str(resolve_model_path(t.path, key="teacher.path"))
    adapter = None
    if t.adapter is not None:
        from rl.loop.checkpoint import find_policy

        policy = find_policy(t.adapter, key="teacher.adapter")
        if policy.adapter is None:
            raise ConfigError(
                f"teacher.adapter={t.adapter} holds a full model ({policy.model}), not a LoRA adapter: give it as "
                "teacher.path instead"
            )
        adapter = str(Path(policy.adapter).resolve())
    return replace(t, path=path, adapter=adapter)


def teacher_in_4bit(cfg: TrainConfig) -> bool:
    """A judge/teacher engine on the actors' own model serves it as they do: in NF4 beside a 4-bit learner with
    `model.actor_base=quantized` (vLLM quantizes it on load; its `teacher.adapter` then runs as native LoRA, since NF4
    weights take no merge). A teacher on another model serves that model's weights as they are."""
    m = cfg.model
    quantized = m.load_in_4bit and m.actor_base == ActorBase.quantized
    return bool(cfg.cluster.num_teachers) and quantized and cfg.teacher.path == (m.actor_path or m.path)


def teacher_engine_config(cfg: TrainConfig) -> TrainConfig:
    """The run config as a judge/teacher engine reads it (resolved `cfg` in; rl/rollout/teacher.py): `teacher.path`
    as the model, a context long enough for a judge prompt and for a student's prompt + completion (+1: the engine
    must generate a token), its adapter merged into the weights (on the actors' NF4 base, `teacher_in_4bit`: quantized
    as theirs and the adapter as native LoRA), its own GPU share, no colocation, no episodes."""
    t, m, c = cfg.teacher, cfg.model, cfg.cluster
    nf4 = teacher_in_4bit(cfg)
    model = replace(
        m,
        path=t.path or m.path,
        actor_path=None,
        load_in_4bit=nf4,
        actor_base=m.actor_base if nf4 else ActorBase.original,
        lora_rank=adapter_lora(t.adapter)[0] if nf4 and t.adapter else m.lora_rank,  # vLLM's LoRA slot: the adapter's
        full_finetune=False,
        init_adapter=None,
        max_prompt_tokens=max(t.max_prompt_tokens, cfg.max_seq_length + 1),
        max_new_tokens=t.max_new_tokens,
    )
    cluster = replace(
        c,
        gpus_per_actor=c.gpus_per_teacher,
        gpu_memory_utilization=c.teacher_memory_utilization or c.gpu_memory_utilization,
        lora_mode=LoraMode.native if nf4 else LoraMode.merged,
        weight_sync=WeightSync.object_store,
        colocate=False,
        staleness=0,
    )
    return replace(cfg, model=model, cluster=cluster, episodes=None)


def resolve_demos(cfg: TrainConfig) -> str | None:
    """`algorithm.demos` as an absolute path to a file that exists (the learner-side reader runs elsewhere)."""
    demos = cfg.algorithm.demos
    if demos is None:
        return None
    path = Path(demos).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"algorithm.demos={demos}: no such file; write one with python -m rl.tools.demos env=... --n N --out FILE"
        )
    return str(path.resolve())


# What a run's folder holds before its first metrics row: Hydra's own files (a sweep job's directory, or hydra.run.dir
# given as the run.output_dir) and the driver's log. A folder holding anything else that is not a run (no RUN_MARKS)
# is someone's own: a run would write into it, and its export would replace an `adapter/` or `model/` there.
RUN_START = (".hydra", "train.log", "logs")
RUN_MARKS = ("metrics.jsonl", "checkpoints", "summary.json")  # a run has written here (metrics.jsonl comes first)


def check_run_dir_is_new(cfg: TrainConfig, run_dir: Path, hydra_dir: Path | None = None) -> None:
    """The run writes only into a folder of its own: a new or empty one (a sweep job's own directory too), or, with
    run.resume=auto, the run it continues (run.resume=<checkpoint>: that checkpoint's run). Another run's directory is
    refused (its metrics.jsonl and checkpoints would be mixed with this run's), and so is a folder of someone's own
    files (an `adapter/` in it would be replaced at export). `hydra_dir`: the folder Hydra writes this job's own
    files into (hydra.run.dir), the run's too where it lies inside `run_dir`."""
    resume = cfg.run.resume
    own_run = resume == "auto" or (
        resume is not None and Path(resume).resolve().parent.parent == Path(run_dir).resolve()
    )
    entries = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    held = [name for name in RUN_MARKS if name in entries]
    if held and own_run:
        return
    if held:
        fix = "give run.resume=auto to continue it" if resume is None else "run.resume=<a checkpoint> starts a new run"
        raise ConfigError(
            f"run.output_dir={run_dir} already holds a run ({', '.join(held)}): {fix}, or another run.output_dir"
        )
    hydra_own = ()
    if hydra_dir is not None and Path(hydra_dir).resolve().is_relative_to(Path(run_dir).resolve()):
        hydra_own = Path(hydra_dir).resolve().relative_to(Path(run_dir).resolve()).parts[:1]
    others = [name for name in entries if name not in RUN_START + hydra_own]
    if others:
        raise ConfigError(
            f"run.output_dir={run_dir} holds files that are not a run's ({first_names(others)}): a run writes only "
            "into a new or empty folder, or its own; give another run.output_dir"
        )
    if own_run:
        return
    for key, folder in (("eval.save_dir", cfg.eval.save_dir), ("logger.rollouts_dir", cfg.logger.rollouts_dir)):
        # given outside the run's folder, they take its step_N.jsonl files: a new run would replace files there
        held = sorted(p.name for p in Path(folder).iterdir()) if folder is not None and Path(folder).is_dir() else []
        if held and not Path(folder).resolve().is_relative_to(Path(run_dir).resolve()):
            raise ConfigError(
                f"{key}={folder} holds files already ({first_names(held)}): a new run writes its step files only "
                f"into a new or empty folder; give another {key}, or leave it unset (a folder inside run.output_dir)"
            )


def first_names(names: list[str]) -> str:
    """The first five `names`, and how many more."""
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def resolve(
    cfg: TrainConfig,
    run_dir: Path | str,
    *,
    model_path: str | None = None,
    new_run: bool = True,
    hydra_dir: Path | None = None,
):
    """`cfg` with every auto filled (same class). `model_path` defaults to resolving `model.path` (converts an
    embedded model once); `new_run`: `run_dir` is a training run's directory (one not its own is refused:
    check_run_dir_is_new; `hydra_dir`, Hydra's own folder for the job, is the run's where it lies inside)."""
    from rl.data.filters import default_overlong_buffer

    run_dir = Path(run_dir)
    check_registry_names(cfg)
    if cfg.episodes is not None:
        raise ConfigError("episodes is filled from env (env.max_turns, env.max_episode_tokens): set those instead")
    if new_run:
        check_run_dir_is_new(cfg, run_dir, hydra_dir)
    if model_path is None:
        from rl.model_path import resolve_model_path

        model_path = resolve_model_path(cfg.model.path)
    m, a = cfg.model, cfg.algorithm
    cfg = replace(cfg, episodes=episode_spec(cfg), model=replace(m, path=str(model_path)))
    m = cfg.model
    completion = cfg.completion_tokens
    cfg = replace(
        cfg,
        model=replace(
            m,
            learner_backend=resolve_learner_backend(cfg),
            dtype=resolve_dtype(m.dtype, cfg.cluster.use_gpu),
            learner_dtype=resolve_dtype(m.learner_dtype, cfg.cluster.use_gpu),
            init_adapter=resolve_init_adapter(cfg),
        ),
        algorithm=replace(
            a,
            loss_agg_norm_length=a.loss_agg_norm_length or completion,
            overlong_buffer=(a.overlong_buffer or default_overlong_buffer(completion)) if a.overlong_penalty else None,
            top_k=a.top_k if a.top_k is not None and a.top_k < a.group_size else None,
            demos=resolve_demos(cfg),
            lr=(FULL_FINETUNE_LR if m.full_finetune else LORA_LR) if a.lr is None else a.lr,
        ),
        cluster=replace(cfg.cluster, lora_mode=resolve_lora_mode(cfg), **resolve_cpu_threads(cfg)),
        learner=replace(cfg.learner, micro_batch_tokens=resolve_micro_batch_tokens(cfg)),
        eval=replace(cfg.eval, save_dir=cfg.eval.save_dir or str(run_dir / "eval")),
        logger=replace(cfg.logger, rollouts_dir=cfg.logger.rollouts_dir or str(run_dir / "rollouts")),
        run=replace(cfg.run, output_dir=str(run_dir)),
    )
    cfg = replace(cfg, model=replace(cfg.model, actor_path=resolve_actor_path(cfg)))  # keyed by the resolved model
    return replace(cfg, teacher=resolve_teacher(cfg))  # after the actors' weights: a null teacher.path is theirs


def from_overrides(model_path: str, *overrides: str, run_dir: Path | str = "outputs/adhoc") -> TrainConfig:
    """The schema's defaults plus dotlist overrides (`algorithm.clip_high=0.28`), validated as at load time and
    resolved, but without Hydra's YAML groups: for scripts, benchmarks and tests that build one role directly."""
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(list(overrides)))
    return resolve(OmegaConf.to_object(merged), Path(run_dir), model_path=str(model_path), new_run=False)
