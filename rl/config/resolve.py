"""Frozen specs for the roles, built once from the validated config: the only reader of the config below train.py.

`build(cfg, run_dir)` resolves every `auto`/`null` value (learner backend and dtype, LoRA mode, loss normaliser,
overlong buffer, output folders, `model.path`), checks the registry names (advantage, policy loss, aggregation)
and returns a `RunSpec`. Every role takes its own spec (`LearnerSpec`, `RolloutSpec`, `PlacementSpec`, ...), so a
knob reaches its use as a typed field and never through a keyword list copied from layer to layer.

Import-light at module level (no torch, no vllm, no ray): `rl/preflight/plan.py` resolves with it too.

Past 400 lines because it is the one reader of the config: every role's spec and every `auto` it resolves sit
here, so that no other module reads a config key; split, the resolutions would need each other's specs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from rl.config.schema import (
    ClusterMode,
    ConfigError,
    EvalCommandConfig,
    LearnerBackend,
    LoraMode,
    PlacementStrategy,
    PolicyLossKnobs,
    RolloutBackend,
    TrainConfig,
    WeightSync,
)
from rl.types import Sampling, TrainedPolicy


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: int
    dropout: float
    targets: tuple[str, ...]


@dataclass(frozen=True)
class LossSpec:
    """What the learner's loss is: registry names, the policy loss's knobs, and the terms added to it."""

    policy_loss: str  # rl/algorithms.py POLICY_LOSSES name
    loss_agg: str  # LOSS_AGGREGATIONS name
    knobs: PolicyLossKnobs  # a copy of the algorithm's policy-loss knobs, read by the loss function
    norm_length: int  # seq_mean_token_sum_norm divisor (tokens)
    entropy_coef: float
    kl_coef: float  # KL to the reference in the loss (0 when it is folded into the reward instead)
    kl_estimator: str
    temperature: float  # the sampling temperature: logprobs are of the distribution the actors sampled


@dataclass(frozen=True)
class OptimSpec:
    lr: float
    weight_decay: float
    max_grad_norm: float  # <= 0: no clipping


@dataclass(frozen=True)
class LearnerSpec:
    model_path: str
    backend: str  # peft | unsloth (auto resolved)
    dtype: str  # base weights' torch dtype name (auto resolved)
    load_in_4bit: bool
    lora: LoraSpec | None  # None: full fine-tuning
    gradient_checkpointing: bool | None  # None: the backend's default
    max_seq_length: int
    loss: LossSpec
    optim: OptimSpec
    micro_batch_size: int  # sequences per padded micro-batch (micro_batch_tokens == 0)
    micro_batch_tokens: int  # > 0: packed micro-batches of at most this many row tokens (rl/learner/packing.py)
    packed_auto: bool  # micro_batch_tokens came from auto: padded micro-batches where the model refuses packed rows
    packed_attention: str  # auto | sdpa | varlen
    share_prompt_prefix: bool
    keep_reference: bool  # a KL (in the loss or the reward) needs the reference policy
    sync_dtype: str | None  # LoRA factors sent to the actors in this dtype (the engine's); None: as trained
    seed: int = 0
    num_threads: int | None = None  # torch threads on CPU (None: every core)
    trust_remote_code: bool = False
    release_memory: bool = False  # colocated with a sleeping engine: return cached GPU memory after each step
    deterministic: bool = False  # torch.use_deterministic_algorithms (and cuBLAS's fixed workspace on CUDA)

    @property
    def full_finetune(self) -> bool:
        return self.lora is None


@dataclass(frozen=True)
class EpisodeSpec:
    """A multi-turn environment as each rollout actor builds and runs it (envs/protocol.py, rl/rollout/episodes.py)."""

    env: str  # the env's config as JSON (`_target_` and keyword arguments, interpolations resolved)
    max_turns: int  # env.max_turns
    max_tokens: int  # env.max_episode_tokens: tokens after the prompt per episode, the model's and the env's
    use_chat_template: bool  # env messages are rendered with the chat template (else joined by newlines)


@dataclass(frozen=True)
class RolloutSpec:
    model_path: str
    backend: RolloutBackend
    dtype: str
    max_model_len: int
    seed: int
    lora_mode: str = "merged"  # merged | native (auto resolved; full fine-tuning: merged, no LoRA slots)
    max_lora_rank: int = 16
    gpu_memory_utilization: float = 0.2
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    weight_sync: WeightSync = WeightSync.object_store
    full_weights: bool = False  # the learner sends every weight (full fine-tuning), not an adapter
    trust_remote_code: bool = False
    sleep_mode: bool = False  # colocated with a learner: the engine can sleep (weights to host, KV cache freed)
    episodes: EpisodeSpec | None = None  # a multi-turn env: generate runs its episodes (None: single-turn)


@dataclass(frozen=True)
class PlacementSpec:
    """Where the roles run: one process (local) or Ray actors with these resources."""

    mode: ClusterMode
    num_actors: int
    num_learners: int
    address: str | None = None
    ray_num_cpus: int | None = None
    use_gpu: bool = False
    gpus_per_actor: float = 1.0
    gpus_per_learner: float = 1.0
    cpus_per_actor: float = 1.0
    cpus_per_learner: float = 1.0
    strategy: PlacementStrategy = PlacementStrategy.PACK
    actor_max_restarts: int = 0
    actor_threads: int | None = None  # CPU threads of a CPU vLLM engine (None: every core)
    colocate: bool = False  # actor i and learner i in one bundle (the same GPU), taking turns
    deterministic: bool = False  # GPU vLLM engines in batch-invariant mode (VLLM_BATCH_INVARIANT=1)
    log_dir: Path = Path("logs")  # each role's stdout and stderr go to <log_dir>/<role><index>.log (rl/logs.py)
    verbose: bool = False  # the roles' every log line on the console, not only their warnings and errors


@dataclass(frozen=True)
class RuntimeSpec:
    """How the driver spreads work over the roles (rl/runtime/pool.py)."""

    staleness: int = 0  # adapter versions the actors may lag (the version bound; the sampler keeps that many ahead)
    actor_max_restarts: int = 0
    learner_chunk_size: int = 0
    weight_sync: WeightSync = WeightSync.object_store
    colocate: bool = False  # the actors sleep while the learners train and wake for the sync
    episodes: bool = False  # a multi-turn env: generate calls send each prompt's item to the actors


@dataclass(frozen=True)
class CurriculumSpec:
    """Which prompts the sampler sends next (rl/data/curriculum.py); the fields are `curriculum.*` (rl/config/schema.py)."""

    kind: str = "none"  # none | pass_rate | difficulty
    threshold: float = 1.0  # a sample passes when its reward >= this (eval_correct_threshold)
    seed: int = 0  # the revisit draws
    solved: float = 1.0
    hopeless: float = 0.0
    ema: float = 0.5
    revisit_prob: float = 0.1
    raise_at: float = 0.8
    window: int = 32
    max_level: int | None = None


@dataclass(frozen=True)
class SamplerSpec:
    """One step's batch (rl/data/sampler.py): prompts, sampling, the queue depth, dynamic sampling, the curriculum."""

    prompts_per_step: int
    sampling: Sampling
    staleness: int = 0
    filter_range: tuple[float, float] | None = None  # dynamic sampling (DAPO eq. 11): keep groups in this range
    max_rounds: int = 1  # batches generated at most per step
    curriculum: CurriculumSpec = CurriculumSpec()
    seed: int = 0  # the run seed: each prompt's sampling seed derives from it (rl/data/prompts.py prompt_seed)


@dataclass(frozen=True)
class SampleSpec:
    """From rewards to the learner's samples (rl/data/prepare.py): shaping, advantages, masks, selection."""

    advantage: str  # ADVANTAGE_ESTIMATORS name
    group_size: int
    std_normalize: bool = True
    std_unbiased: bool = True
    pg_baseline: str = "none"
    adv_eps: float = 1e-6
    max_new_tokens: int = 64
    overlong_buffer: int | None = None  # DAPO soft overlong punishment's L_cache (None: no penalty)
    overlong_penalty_factor: float = 1.0
    filter_truncated: bool = False
    top_k: int | None = None
    kl_in_reward_coef: float = 0.0  # KL folded into the reward with this weight (0: not)
    kl_estimator: str = "k3"


@dataclass(frozen=True)
class EvalSpec:
    """Held-out evaluation (rl/evaluation.py)."""

    size: int = 0  # held-out prompts (0: no evaluation)
    interval: int = 0  # also every N steps (0: before and after only)
    max_tokens: int = 64
    n_samples: int = 0  # sampled completions per prompt for pass@k (0: greedy only)
    temperature: float = 1.0
    pass_k: tuple[int, ...] = (1,)
    threshold: float = 1.0  # reward >= threshold counts as correct
    save_dir: Path | None = None  # one step_N.jsonl per evaluation (None: not written)
    seed: int = 0  # the run seed: the sampled completions' seeds derive from it, the step and the prompt


@dataclass(frozen=True)
class DataSpec:
    max_prompt_tokens: int
    use_chat_template: bool
    seed: int


@dataclass(frozen=True)
class RunSpec:
    """Everything a run needs, resolved."""

    run_dir: Path
    model_path: str
    trust_remote_code: bool
    seed: int
    steps: int
    data: DataSpec
    sampler: SamplerSpec
    samples: SampleSpec
    learner: LearnerSpec
    rollout: RolloutSpec
    placement: PlacementSpec
    runtime: RuntimeSpec
    eval: EvalSpec
    updates_per_step: int = 1
    probe_threshold: float = 0.2
    rollout_save_interval: int = 0
    rollout_save_dir: Path | None = None
    save_interval: int = 0
    keep_last: int = 0
    max_nonfinite_steps: int = 3
    resume: str | None = None


# ------------------------------------------------------------------------------------------------ resolution

CURRICULUM_KNOBS = ("solved", "hopeless", "ema", "revisit_prob", "raise_at", "window", "max_level")


def resolve_lora_mode(cfg: TrainConfig) -> str:
    """`cluster.lora_mode` as the actors run it. auto = merged on every device: vLLM's LoRA kernels decode slower
    than merged weights (docs/benchmarks.md: 7.6-9.2x on a 2-core CPU, 0.8x the speed on an H200 at 0.5B) and a
    merged load costs about 0.2 s per version there. Full fine-tuning has no adapter: merged (no LoRA slots)."""
    if cfg.model.full_finetune or cfg.cluster.lora_mode == LoraMode.auto:
        return LoraMode.merged.value
    return cfg.cluster.lora_mode.value


def resolve_learner_backend(cfg: TrainConfig) -> str:
    """auto = unsloth on GPUs when the package is installed (the fastest 4-bit LoRA path measured), else peft.
    Looks for the package without importing it (its import patches torch)."""
    import importlib.util

    name = cfg.model.learner_backend
    if name != LearnerBackend.auto:
        return name.value
    return "unsloth" if cfg.cluster.use_gpu and importlib.util.find_spec("unsloth") is not None else "peft"


# auto's packed row with the PEFT backend. CPU: at the demo's batch (64 sequences of 67-97 tokens, 8 prompts shared)
# packed rows with the shared prompt step 1.57x faster than padded micro-batches of 16, and 1.38-1.74x at 20-1000-token
# completions. GPU: a small model's step is launch-bound, so fewer and fuller forwards win: at 32 prompts x 8 (20-256
# tokens) on an H200 the learner took 0.5-0.8 s per step in rows of 16384 tokens against 29 s padded with the
# KV-cache prompt (docs/benchmarks.md). Either budget is capped at the padded micro-batch's worst case
# (micro_batch_size x (model.max_prompt_tokens + model.max_new_tokens) tokens), so that auto never asks for more
# activation memory than padding would. Unsloth refuses packed rows;
# `deterministic=true` on a GPU stays padded: the deterministic GPU runs were verified padded, and the varlen flash
# backward's determinism is not (flash kernels accumulate the query gradient with atomics unless told otherwise).
CPU_PACKED_TOKENS = 4096
GPU_PACKED_TOKENS = 16384


def resolve_micro_batch_tokens(cfg: TrainConfig) -> int:
    """micro_batch_tokens as the learner uses it: the config's value, or for auto (null) with the PEFT backend
    CPU_PACKED_TOKENS on a CPU learner and GPU_PACKED_TOKENS on a GPU one, at most the padded micro-batch's worst
    case; 0 (padded micro-batches) with Unsloth and for deterministic GPU runs."""
    if cfg.micro_batch_tokens is not None:
        return cfg.micro_batch_tokens
    if resolve_learner_backend(cfg) != "peft" or (cfg.cluster.use_gpu and cfg.deterministic):
        return 0
    padded = cfg.micro_batch_size * (cfg.model.max_prompt_tokens + cfg.model.max_new_tokens)
    return min(GPU_PACKED_TOKENS if cfg.cluster.use_gpu else CPU_PACKED_TOKENS, padded)


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
    import json

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
    return EpisodeSpec(json.dumps(env), *limits, cfg.model.use_chat_template)


def copy_fields(source: object, cls: type):
    """An instance of dataclass `cls` with the same-named field values of `source` (a config that mixes it in)."""
    return cls(**{f.name: getattr(source, f.name) for f in dataclasses.fields(cls)})


def check_run_dir_is_new(cfg: TrainConfig, run_dir: Path) -> None:
    """A run that does not resume must not write into another run's directory: its metrics would be appended to
    that run's metrics.jsonl and its checkpoints mixed with that run's."""
    if cfg.resume is not None:
        return
    held = [name for name in ("metrics.jsonl", "checkpoints") if (run_dir / name).exists()]
    if held:
        raise ConfigError(
            f"output_dir={run_dir} already holds a run ({', '.join(held)}): give resume=auto to continue it, or "
            "another output_dir"
        )


def build(cfg: TrainConfig, run_dir: Path, *, model_path: str | None = None, new_run: bool = True) -> RunSpec:
    """The run's specs. `model_path` defaults to resolving `model.path` (converts an embedded model once);
    `new_run`: `run_dir` is a training run's directory (another run's is refused unless it resumes)."""
    from rl.data.filters import default_overlong_buffer

    check_registry_names(cfg)
    if new_run:
        check_run_dir_is_new(cfg, Path(run_dir))
    if model_path is None:
        from rl.model_path import resolve_model_path

        model_path = resolve_model_path(cfg.model.path)
    m, a, c = cfg.model, cfg.algorithm, cfg.cluster
    run_dir = Path(run_dir)
    episodes = episode_spec(cfg)
    # tokens after the prompt: one completion, or a whole episode (model and environment tokens)
    completion_len = episodes.max_tokens if episodes else m.max_new_tokens
    max_len = m.max_prompt_tokens + completion_len
    vllm = c.rollout_backend == RolloutBackend.vllm
    loss = LossSpec(
        policy_loss=a.policy_loss,
        loss_agg=a.loss_agg,
        knobs=copy_fields(a, PolicyLossKnobs),
        norm_length=a.loss_agg_norm_length or completion_len,
        entropy_coef=a.entropy_coef,
        kl_coef=0.0 if a.kl_in_reward else a.kl_coef,
        kl_estimator=a.kl_estimator.value,
        temperature=a.temperature,
    )
    learner = LearnerSpec(
        model_path=model_path,
        backend=resolve_learner_backend(cfg),
        dtype="bfloat16" if m.learner_dtype.value == "auto" else m.learner_dtype.value,
        load_in_4bit=m.load_in_4bit,
        lora=None if m.full_finetune else LoraSpec(m.lora_rank, m.lora_alpha, m.lora_dropout, tuple(m.lora_targets)),
        gradient_checkpointing=m.gradient_checkpointing,
        max_seq_length=max_len,
        loss=loss,
        optim=OptimSpec(a.lr, a.weight_decay, a.max_grad_norm),
        micro_batch_size=cfg.micro_batch_size,
        micro_batch_tokens=resolve_micro_batch_tokens(cfg),
        packed_auto=cfg.micro_batch_tokens is None,
        packed_attention=cfg.packed_attention.value,
        share_prompt_prefix=cfg.share_prompt_prefix,
        keep_reference=a.kl_coef > 0,
        # a vLLM actor holds LoRA factors in its weights' dtype either way (merged or native): send them so
        sync_dtype=m.dtype.value if vllm and m.dtype.value in ("bfloat16", "float16") else None,
        seed=cfg.seed,
        num_threads=c.learner_threads,
        trust_remote_code=m.trust_remote_code,
        release_memory=c.colocate,
        deterministic=cfg.deterministic,
    )
    rollout = RolloutSpec(
        model_path=model_path,
        backend=c.rollout_backend,
        dtype=m.dtype.value,
        max_model_len=max_len,
        seed=cfg.seed,
        lora_mode=resolve_lora_mode(cfg),
        max_lora_rank=m.lora_rank,
        gpu_memory_utilization=c.gpu_memory_utilization,
        enforce_eager=c.enforce_eager,
        tensor_parallel_size=max(1, int(c.gpus_per_actor)) if c.use_gpu else 1,
        weight_sync=c.weight_sync,
        full_weights=m.full_finetune,
        trust_remote_code=m.trust_remote_code,
        sleep_mode=c.colocate,
        episodes=episodes,
    )
    placement = PlacementSpec(
        mode=c.mode,
        num_actors=c.num_actors,
        num_learners=c.num_learners,
        address=c.address,
        ray_num_cpus=c.ray_num_cpus,
        use_gpu=c.use_gpu,
        gpus_per_actor=c.gpus_per_actor,
        gpus_per_learner=c.gpus_per_learner,
        cpus_per_actor=c.cpus_per_actor,
        cpus_per_learner=c.cpus_per_learner,
        strategy=c.placement_strategy,
        actor_max_restarts=c.actor_max_restarts,
        actor_threads=c.actor_threads,
        colocate=c.colocate,
        deterministic=cfg.deterministic,
        log_dir=run_dir / "logs",
        verbose=cfg.verbose,
    )
    sampler = SamplerSpec(
        prompts_per_step=cfg.prompts_per_step,
        sampling=Sampling(n=a.group_size, temperature=a.temperature, top_p=a.top_p, max_tokens=m.max_new_tokens),
        staleness=c.staleness,
        filter_range=tuple(a.filter_range) if a.dynamic_sampling else None,
        max_rounds=a.dynamic_sampling_max_rounds if a.dynamic_sampling else 1,
        curriculum=CurriculumSpec(
            kind=cfg.curriculum.kind.value,
            threshold=cfg.eval_correct_threshold,
            seed=cfg.seed,
            **{k: getattr(cfg.curriculum, k) for k in CURRICULUM_KNOBS},
        ),
        seed=cfg.seed,
    )
    samples = SampleSpec(
        advantage=a.advantage,
        group_size=a.group_size,
        std_normalize=a.std_normalize,
        std_unbiased=a.std_unbiased,
        pg_baseline=a.pg_baseline.value,
        adv_eps=a.adv_eps,
        max_new_tokens=completion_len,
        overlong_buffer=(a.overlong_buffer or default_overlong_buffer(completion_len)) if a.overlong_penalty else None,
        overlong_penalty_factor=a.overlong_penalty_factor,
        filter_truncated=a.filter_truncated_response,
        top_k=a.top_k if a.top_k is not None and a.top_k < a.group_size else None,
        kl_in_reward_coef=a.kl_coef if a.kl_in_reward else 0.0,
        kl_estimator=a.kl_estimator.value,
    )
    evaluation = EvalSpec(
        size=cfg.eval_size,
        interval=cfg.eval_interval,
        max_tokens=m.max_new_tokens,
        n_samples=cfg.eval_n_samples,
        temperature=cfg.eval_temperature,
        pass_k=tuple(cfg.eval_pass_k),
        threshold=cfg.eval_correct_threshold,
        save_dir=Path(cfg.eval_save_dir) if cfg.eval_save_dir else run_dir / "eval",
        seed=cfg.seed,
    )
    return RunSpec(
        run_dir=run_dir,
        model_path=model_path,
        trust_remote_code=m.trust_remote_code,
        seed=cfg.seed,
        steps=cfg.steps,
        data=DataSpec(m.max_prompt_tokens, m.use_chat_template, cfg.seed),
        sampler=sampler,
        samples=samples,
        learner=learner,
        rollout=rollout,
        placement=placement,
        runtime=RuntimeSpec(
            c.staleness,
            c.actor_max_restarts,
            c.learner_chunk_size,
            c.weight_sync,
            colocate=c.colocate,
            episodes=episodes is not None,
        ),
        eval=evaluation,
        updates_per_step=a.updates_per_step,
        probe_threshold=cfg.sync_probe_threshold,
        rollout_save_interval=cfg.rollout_save_interval,
        rollout_save_dir=Path(cfg.rollout_save_dir) if cfg.rollout_save_dir else run_dir / "rollouts",
        save_interval=cfg.save_interval,
        keep_last=cfg.keep_last,
        max_nonfinite_steps=cfg.max_nonfinite_steps,
        resume=cfg.resume,
    )


@dataclass(frozen=True)
class EvalCommandSpec:
    """`python -m rl.tools.eval` resolved: one rollout engine per policy (the base model, then the trained policy), the
    evaluation, which eval sets, and where the results go."""

    rollout: RolloutSpec  # the base model's engine (a trained HF model folder gets a copy with its path)
    placement: PlacementSpec  # the engine's CPU threads / GPU use, as a run's rollout actor
    eval: EvalSpec  # pass_k always holds 1 and n_samples (avg@n and pass@n); save_dir is out_dir
    data: DataSpec
    out_dir: Path
    compare_base: bool
    policy: TrainedPolicy | None  # rl.checkpoint.find_policy's answer (None: the base model only)
    eval_only: tuple[str, ...] = ()


def build_eval(
    cfg: EvalCommandConfig, out_dir: Path, policy: TrainedPolicy | None, *, model_path: str | None = None
) -> EvalCommandSpec:
    """The eval command's specs: the training build (so every model/cluster/eval_* key means what it means in a
    run), the trained policy `cfg.adapter` names (found by rl.checkpoint.find_policy) and the LoRA rank the engine
    needs for it (native LoRA slots)."""
    run = build(cfg, out_dir, model_path=model_path, new_run=False)
    rollout = run.rollout
    if policy is not None and policy.adapter is not None:
        import json

        adapter_config = json.loads((policy.adapter / "adapter_config.json").read_text())
        rollout = dataclasses.replace(
            rollout,
            max_lora_rank=max(rollout.max_lora_rank, int(adapter_config.get("r", 0))),
            full_weights=bool(adapter_config.get("full_weights")),
        )
    n = cfg.eval_n_samples
    evaluation = dataclasses.replace(
        run.eval, pass_k=tuple(sorted({1, *cfg.eval_pass_k, *([n] if n else [])})), save_dir=Path(out_dir)
    )
    return EvalCommandSpec(
        rollout=rollout,
        placement=run.placement,
        eval=evaluation,
        data=run.data,
        out_dir=Path(out_dir),
        compare_base=cfg.compare_base or policy is None,
        policy=policy,
        eval_only=tuple(cfg.eval_only),
    )


def build_from_overrides(model_path: str, *overrides: str, run_dir: Path | str = "outputs/adhoc") -> RunSpec:
    """The specs of the schema's defaults plus dotlist overrides (`algorithm.clip_high=0.28`), validated as at load
    time but without Hydra's YAML groups: for scripts, benchmarks and tests that build one role directly."""
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(list(overrides)))
    return build(OmegaConf.to_object(merged), Path(run_dir), model_path=str(model_path))
