"""Typed configuration schema (Hydra structured configs).

The shapes, defaults and one-line descriptions live here; `conf/*.yaml` states only what differs from them. Hydra
merges every YAML file and command-line override into these dataclasses, so an unknown key or a wrong type fails
at composition time. Cross-field checks are in `__post_init__` and raise `ConfigError` naming the key and the fix;
registry names and `auto` values are resolved right after, by rl/config/resolve.py, before anything starts.

This module must stay import-light (no torch, no vllm, no ray): `python train.py --help` imports it.

Past 400 lines because it is the whole schema, one dataclass per config group with each field's description
(what `--help` prints) and that group's checks beside it; one file reads as the reference of every key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class ConfigError(ValueError):
    """A user-facing configuration error; its message names the key and the fix (printed as one line)."""


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    auto = "auto"


class ClusterMode(str, Enum):
    ray = "ray"  # rollout actors and learners are Ray actors (local Ray started when address is null)
    local = "local"  # the same plain classes in this one process, without Ray (tests, debugging)


class RolloutBackend(str, Enum):
    vllm = "vllm"  # vLLM engine (CPU build here, CUDA build on GPUs)
    hf = "hf"  # transformers `generate` (debugging; slow)


class LearnerBackend(str, Enum):
    auto = "auto"  # unsloth on CUDA when the package is installed, else peft (resolved in rl/config/resolve.py)
    peft = "peft"  # transformers + PEFT LoRA (any device; bitsandbytes NF4 with model.load_in_4bit on CUDA)
    unsloth = "unsloth"  # Unsloth FastLanguageModel (CUDA only)


class LoraMode(str, Enum):
    auto = "auto"  # = merged on every device (rl/config/resolve.py says why)
    merged = "merged"  # each adapter version merged into the engine's weights (base-model decode speed)
    native = "native"  # vLLM's LoRA kernels (LoRARequest), the adapter kept apart from the weights


class PackedAttention(str, Enum):
    auto = "auto"  # varlen on CUDA when a flash kernel is installed, else sdpa
    sdpa = "sdpa"  # torch SDPA once per packed sequence (any device)
    varlen = "varlen"  # one varlen flash call per packed row (CUDA: flash-attn or torch's varlen_attn)


class WeightSync(str, Enum):
    object_store = "object_store"  # adapter or weights as bytes through Ray's object store (any device)
    ipc = "ipc"  # the policy (full weights or LoRA factors) as CUDA IPC handles, actors on the learner's GPU


class PlacementStrategy(str, Enum):
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


class KLEstimator(str, Enum):
    k1 = "k1"  # log r
    k2 = "k2"  # (log r)^2 / 2
    k3 = "k3"  # exp(-log r) - 1 + log r (unbiased, low variance)


class PgBaseline(str, Enum):
    none = "none"  # plain REINFORCE: A = r
    group_mean = "group_mean"  # A = r - mean of the prompt's G rewards


class WandbMode(str, Enum):
    online = "online"
    offline = "offline"  # no account needed; `wandb sync` later
    disabled = "disabled"


class LoggerKind(str, Enum):
    none = "none"  # console only (metrics.jsonl is still written)
    jsonl = "jsonl"  # console + metrics.jsonl
    wandb = "wandb"  # console + metrics.jsonl + Weights & Biases


class CurriculumKind(str, Enum):
    none = "none"  # prompts in the data's seeded order
    pass_rate = "pass_rate"  # skip prompts whose recent pass rate says solved or hopeless (rl/data/curriculum.py)
    difficulty = "difficulty"  # raise a reasoning-gym task's difficulty level when its accuracy passes raise_at


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass
class ModelConfig:
    path: str = "embedded:smollm2-135m-instruct"  # local HF folder, hub id, or embedded:<name> (shipped wheel)
    dtype: DType = DType.bfloat16  # rollout engine weights dtype
    learner_dtype: DType = DType.auto  # learner base weights dtype; auto = bfloat16 (LoRA weights stay fp32)
    lora_rank: int = 16  # LoRA rank r
    lora_alpha: int = 32  # LoRA scaling numerator (scale = alpha / r)
    lora_dropout: float = 0.0  # dropout on the LoRA input; keep 0 so learner and actor agree exactly
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )  # module names that get LoRA adapters
    load_in_4bit: bool = False  # learner base weights in 4-bit (bitsandbytes NF4 / Unsloth; CUDA only)
    learner_backend: LearnerBackend = (
        LearnerBackend.auto
    )  # auto (unsloth on CUDA when installed, else peft) | peft | unsloth
    full_finetune: bool = (
        False  # train every parameter instead of LoRA (KL reference: a frozen copy; sync: all weights)
    )
    gradient_checkpointing: bool | None = None  # null: backend default (unsloth: on, "unsloth" offload; peft: off)
    max_prompt_tokens: int = 256  # prompts longer than this (after the chat template) are dropped and counted
    max_new_tokens: int = 32  # completion length cap (tokens)
    use_chat_template: bool = True  # wrap prompts in the tokenizer's chat template
    trust_remote_code: bool = False  # passed to transformers / vLLM

    def __post_init__(self) -> None:
        _check(self.lora_rank > 0, f"model.lora_rank must be > 0 (got {self.lora_rank})")
        _check(bool(self.lora_targets), "model.lora_targets is empty: name at least one module, e.g. [q_proj,v_proj]")
        _check(self.max_new_tokens > 0, f"model.max_new_tokens must be > 0 (got {self.max_new_tokens})")
        _check(self.max_prompt_tokens > 0, f"model.max_prompt_tokens must be > 0 (got {self.max_prompt_tokens})")
        _check(0.0 <= self.lora_dropout < 1.0, f"model.lora_dropout must be in [0, 1) (got {self.lora_dropout})")
        _check(
            not (self.full_finetune and self.load_in_4bit),
            "model.full_finetune=true cannot train 4-bit weights: set model.load_in_4bit=false",
        )


@dataclass
class PolicyLossKnobs:
    """The policy losses' knobs (keys of `algorithm`). The learner hands a copy of them to the loss function, which
    reads the ones it uses (rl/algorithms.py): a new knob is a field here, its value in YAML, and its use there."""

    clip_low: float = 0.2  # ratio lower clip: 1 - clip_low
    clip_high: float = 0.2  # ratio upper clip: 1 + clip_high (DAPO clip-higher uses 0.28)
    dual_clip: float = 0.0  # clipped loss: cap -A*ratio at -A*dual_clip for A < 0 (dual-clip PPO; > 1 enables, 0 off)
    tis_cap: float = 0.0  # truncated importance sampling: weight tokens by min(pi_learner/pi_actor, tis_cap) (0 off)
    skip_threshold: float = 0.0  # zero the loss of sequences whose mean pi_learner/pi_actor ratio exceeds this (0 off)
    positive_weight: float = 1.0  # scale the loss of positive-advantage samples (W-REINFORCE: 0.1; 1 = off)

    def __post_init__(self) -> None:
        _check(self.clip_low >= 0 and self.clip_high >= 0, "algorithm.clip_low/clip_high must be >= 0")
        _check(
            self.dual_clip == 0 or self.dual_clip > 1,
            f"algorithm.dual_clip must be 0 (off) or > 1 (got {self.dual_clip})",
        )
        _check(
            self.tis_cap >= 0 and self.skip_threshold >= 0,
            "algorithm.tis_cap and algorithm.skip_threshold must be >= 0 (0 disables)",
        )
        _check(self.positive_weight >= 0, f"algorithm.positive_weight must be >= 0 (got {self.positive_weight})")


@dataclass
class AlgorithmConfig(PolicyLossKnobs):
    name: str = "grpo"  # label for logs and sweep reports
    advantage: str = "grpo"  # advantage estimator, by registry name (rl/algorithms.py)
    policy_loss: str = "clipped"  # policy loss, by registry name
    loss_agg: str = "seq_mean_token_mean"  # token -> scalar aggregation, by registry name
    group_size: int = 8  # G: completions sampled per prompt
    std_normalize: bool = True  # grpo: divide group-centred rewards by the group std
    std_unbiased: bool = True  # grpo: sample std (n-1, as TRL/verl) if true, population std (n) if false
    pg_baseline: PgBaseline = PgBaseline.none  # pg advantage baseline: none (plain REINFORCE) | group_mean
    adv_eps: float = 1e-6  # grpo: added to the std before dividing; reinforce_pp: added to the batch variance
    loss_agg_norm_length: int | None = None  # seq_mean_token_sum_norm divisor in tokens (null: model.max_new_tokens)
    entropy_coef: float = 0.0  # entropy bonus weight: loss -= entropy_coef * agg(token entropy) (0 off; costs memory)
    kl_coef: float = 0.01  # weight of the KL penalty to the reference policy (0 disables; adapter off = reference)
    kl_estimator: KLEstimator = KLEstimator.k3  # k1 | k2 | k3 (Schulman's estimators)
    kl_in_reward: bool = (
        False  # fold the KL into the reward (r - kl_coef * sum_t kl_t, before advantages), not the loss
    )
    dynamic_sampling: bool = False  # DAPO: drop groups whose accuracy is outside filter_range, regenerate to fill
    filter_range: list[float] = field(default_factory=lambda: [0.01, 0.99])  # [low, high] group mean reward to keep
    dynamic_sampling_max_rounds: int = 4  # generate at most this many batches per step before training on fewer
    overlong_penalty: bool = False  # DAPO soft overlong punishment (eq. 13) added to the reward
    overlong_buffer: int | None = None  # L_cache in tokens (null: min(1024, model.max_new_tokens // 4))
    overlong_penalty_factor: float = 1.0  # scale of the overlong penalty (reward units at full length)
    filter_truncated_response: bool = False  # mask responses cut by max_new_tokens out of the loss
    top_k: int | None = None  # keep only the k highest-reward completions per prompt for the learner (null: all G)
    lr: float = 2e-4  # AdamW learning rate for the LoRA parameters
    weight_decay: float = 0.0  # AdamW weight decay
    max_grad_norm: float = 1.0  # gradient clipping by global norm (<= 0 disables)
    updates_per_step: int = 1  # optimizer steps per rollout batch (mini-batches); 1 = fully on-policy
    temperature: float = 1.0  # sampling temperature for rollouts
    top_p: float = 1.0  # nucleus sampling for rollouts

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.group_size >= 2, f"algorithm.group_size must be >= 2 for group baselines (got {self.group_size})")
        _check(self.lr > 0, f"algorithm.lr must be > 0 (got {self.lr})")
        _check(self.updates_per_step >= 1, f"algorithm.updates_per_step must be >= 1 (got {self.updates_per_step})")
        _check(
            self.tis_cap == 0 or self.updates_per_step == 1,
            "algorithm.tis_cap > 0 uses the learner's current logprobs as the proximal policy: set "
            "algorithm.updates_per_step=1 or algorithm.tis_cap=0",
        )
        _check(self.entropy_coef >= 0, f"algorithm.entropy_coef must be >= 0 (got {self.entropy_coef})")
        _check(self.kl_coef >= 0, f"algorithm.kl_coef must be >= 0 (got {self.kl_coef})")
        _check(
            not self.kl_in_reward or self.kl_coef > 0,
            "algorithm.kl_in_reward=true needs algorithm.kl_coef > 0 (the penalty's weight)",
        )
        _check(
            len(self.filter_range) == 2 and self.filter_range[0] <= self.filter_range[1],
            f"algorithm.filter_range must be [low, high] with low <= high (got {list(self.filter_range)})",
        )
        _check(self.dynamic_sampling_max_rounds >= 1, "algorithm.dynamic_sampling_max_rounds must be >= 1")
        _check(
            self.overlong_buffer is None or self.overlong_buffer > 0, "algorithm.overlong_buffer must be > 0 or null"
        )
        _check(
            self.loss_agg_norm_length is None or self.loss_agg_norm_length > 0,
            "algorithm.loss_agg_norm_length must be > 0 or null (null: model.max_new_tokens)",
        )
        _check(
            self.top_k is None or 1 <= self.top_k <= self.group_size,
            f"algorithm.top_k={self.top_k} must be null or in [1, algorithm.group_size={self.group_size}]",
        )
        _check(self.temperature > 0, f"algorithm.temperature must be > 0 (got {self.temperature})")
        _check(0 < self.top_p <= 1, f"algorithm.top_p must be in (0, 1] (got {self.top_p})")


@dataclass
class ClusterConfig:
    mode: ClusterMode = ClusterMode.ray  # ray: Ray actors; local: everything in this process (no Ray)
    num_actors: int = 1  # vLLM rollout actors
    num_learners: int = 1  # LoRA learners
    address: str | None = None  # Ray address: null starts a local Ray; "auto" or host:port joins a cluster
    use_gpu: bool = False  # place roles on GPUs (false: CPU resources only, as on this machine and in CI)
    gpus_per_actor: float = 1.0  # GPUs per rollout actor (vLLM tensor parallel when > 1), when use_gpu
    gpus_per_learner: float = 1.0  # GPUs per learner, when use_gpu
    cpus_per_actor: float = 1.0  # Ray CPU resources reserved per rollout actor
    cpus_per_learner: float = 1.0  # Ray CPU resources reserved per learner
    placement_strategy: PlacementStrategy = PlacementStrategy.PACK  # Ray placement group strategy (PACK: fewest nodes)
    rollout_backend: RolloutBackend = RolloutBackend.vllm  # vllm or hf (debugging)
    lora_mode: LoraMode = LoraMode.auto  # vLLM adapter loading: merged (into the weights) | native (LoRARequest) | auto
    actor_threads: int | None = None  # CPU threads of a CPU vLLM engine (null: all cores)
    learner_threads: int | None = None  # torch threads of a CPU learner (null: all cores)
    gpu_memory_utilization: float = 0.2  # vLLM memory fraction (CPU: of a NUMA node, for the engine's whole process)
    enforce_eager: bool = True  # vLLM: no CUDA graphs / compilation (faster start; set false for long GPU runs)
    ray_num_cpus: int | None = None  # CPUs a local Ray advertises (null: what Ray detects)
    weight_sync: WeightSync = WeightSync.object_store  # object_store (bytes, any device) | ipc (CUDA, learner's GPU)
    staleness: int = 0  # steps actors may run ahead of learners (0: synchronous; k: generate step t+k while training t)
    actor_max_restarts: int = 2  # times Ray restarts a dead rollout actor (its prompts go to a live one meanwhile)
    learner_chunk_size: int = 0  # prompts each learner generates per generate call, HF generate (0: actors only)
    colocate: bool = False  # actor i and learner i time-share one GPU: the engine sleeps while the learner trains

    def __post_init__(self) -> None:
        _check(self.num_actors >= 1, f"cluster.num_actors must be >= 1 (got {self.num_actors})")
        _check(self.num_learners >= 1, f"cluster.num_learners must be >= 1 (got {self.num_learners})")
        _check(0 < self.gpu_memory_utilization <= 1, "cluster.gpu_memory_utilization must be in (0, 1]")
        _check(
            self.weight_sync == WeightSync.object_store or self.use_gpu,
            "cluster.weight_sync=ipc shares CUDA memory between processes: set cluster.use_gpu=true",
        )
        _check(
            self.weight_sync == WeightSync.object_store or self.mode == ClusterMode.ray,
            "cluster.weight_sync=ipc connects separate processes: use cluster.mode=ray",
        )
        _check(
            self.weight_sync == WeightSync.object_store or self.rollout_backend == RolloutBackend.vllm,
            "cluster.weight_sync=ipc loads into vLLM engines: set cluster.rollout_backend=vllm",
        )
        if self.weight_sync == WeightSync.ipc:
            self._check_ipc_placement()
        _check(self.staleness >= 0, f"cluster.staleness must be >= 0 (0: synchronous; got {self.staleness})")
        _check(
            self.learner_chunk_size >= 0,
            f"cluster.learner_chunk_size must be >= 0 (0: only the actors generate; got {self.learner_chunk_size})",
        )
        _check(self.actor_max_restarts >= 0, f"cluster.actor_max_restarts must be >= 0 (got {self.actor_max_restarts})")
        if self.colocate:
            self._check_colocate()
        if self.mode == ClusterMode.local:
            _check(
                self.num_actors == 1 and self.num_learners == 1,
                "cluster.mode=local runs one actor and one learner in-process: set cluster.num_actors=1 "
                "cluster.num_learners=1, or use cluster.mode=ray",
            )
            _check(
                self.staleness == 0,
                f"cluster.mode=local runs the roles one after the other, so it cannot overlap them: set "
                f"cluster.staleness=0 (got {self.staleness}) or use cluster.mode=ray",
            )

    def _check_ipc_placement(self) -> None:
        """A CUDA IPC handle opens only on the GPU that made it, and the sync hands learner 0's handles to every
        actor: all actors must sit on learner 0's GPU (Ray packs fractional bundles onto one GPU)."""
        if self.colocate:  # pairs: actor i shares learner i's GPU, so only actor 0 shares learner 0's
            _check(
                self.num_actors == 1,
                f"cluster.weight_sync=ipc hands learner 0's policy to every actor, and cluster.colocate=true puts actor "
                f"i on learner i's GPU: set cluster.num_actors=1 cluster.num_learners=1 (got {self.num_actors}), or "
                "cluster.weight_sync=object_store",
            )
            return
        share = self.num_actors * self.gpus_per_actor + self.gpus_per_learner
        each = math.floor(100 / (self.num_actors + 1)) / 100  # an equal share per role that fits
        _check(
            share <= 1,
            f"cluster.weight_sync=ipc needs every actor on learner 0's GPU, but cluster.num_actors={self.num_actors} x "
            f"cluster.gpus_per_actor={self.gpus_per_actor} + cluster.gpus_per_learner={self.gpus_per_learner} = "
            f"{share:g} GPUs: make them fit one GPU (e.g. cluster.gpus_per_actor={each:g} "
            f"cluster.gpus_per_learner={each:g}), set cluster.colocate=true, or use cluster.weight_sync=object_store",
        )

    def _check_colocate(self) -> None:
        """Time-sharing a GPU (vLLM sleep mode) works on CUDA only, pairs one actor with one learner on the same
        GPU, and cannot overlap generation with training."""
        _check(
            self.use_gpu and self.mode == ClusterMode.ray,
            "cluster.colocate=true time-shares a GPU through vLLM's sleep mode (CUDA only): set cluster.use_gpu=true "
            "(and cluster.mode=ray)",
        )
        _check(
            self.staleness == 0,
            f"cluster.colocate=true: the engine sleeps while the learner trains, so nothing is generated ahead: set "
            f"cluster.staleness=0 (got {self.staleness})",
        )
        _check(
            self.num_actors == self.num_learners,
            f"cluster.colocate=true pairs actor i with learner i on one GPU: set cluster.num_actors equal to "
            f"cluster.num_learners (got {self.num_actors} and {self.num_learners})",
        )
        _check(
            self.gpus_per_actor == self.gpus_per_learner and self.gpus_per_actor <= 1,
            f"cluster.colocate=true: each actor/learner pair shares one GPU (or the same fraction of one): set "
            f"cluster.gpus_per_actor = cluster.gpus_per_learner <= 1 (got {self.gpus_per_actor} and "
            f"{self.gpus_per_learner})",
        )
        _check(
            self.learner_chunk_size == 0,
            "cluster.colocate=true: the learners cannot generate while the engine is awake: set cluster.learner_chunk_size=0",
        )


@dataclass
class CurriculumConfig:
    kind: CurriculumKind = CurriculumKind.none  # none | pass_rate | difficulty (rl/data/curriculum.py)
    solved: float = 1.0  # pass_rate: skip a prompt whose recent pass rate is >= this (1: every sample correct)
    hopeless: float = 0.0  # pass_rate: skip a prompt whose recent pass rate is <= this (0: no sample correct)
    ema: float = 0.5  # pass_rate: weight of the old estimate when a visit's pass rate is folded in (0: last visit only)
    revisit_prob: float = 0.1  # pass_rate: chance that a prompt due to be skipped is sent anyway (its rate refreshed)
    raise_at: float = 0.8  # difficulty: raise the level when the accuracy of the last `window` prompt groups is >= this
    window: int = 32  # difficulty: prompt groups (at the current level) that accuracy is measured over
    max_level: int | None = None  # difficulty: the highest level to raise to (null: the task curriculum's last)

    def __post_init__(self) -> None:
        _check(
            0.0 <= self.hopeless < self.solved <= 1.0,
            f"curriculum.hopeless={self.hopeless} and curriculum.solved={self.solved} need 0 <= hopeless < solved <= 1",
        )
        _check(0.0 <= self.ema < 1.0, f"curriculum.ema must be in [0, 1) (got {self.ema})")
        _check(0.0 <= self.revisit_prob <= 1.0, f"curriculum.revisit_prob must be in [0, 1] (got {self.revisit_prob})")
        _check(0.0 < self.raise_at <= 1.0, f"curriculum.raise_at must be in (0, 1] (got {self.raise_at})")
        _check(self.window >= 1, f"curriculum.window must be >= 1 (got {self.window})")
        _check(self.max_level is None or self.max_level >= 0, "curriculum.max_level must be >= 0 or null")


@dataclass
class LoggerConfig:
    kind: LoggerKind = LoggerKind.jsonl  # none | jsonl | wandb (metrics.jsonl is always written)
    mode: WandbMode = WandbMode.offline  # wandb mode: online | offline (no account) | disabled
    project: str = "rlft"  # wandb project
    name: str | None = None  # wandb run name (null: the Hydra job name + time)
    group: str | None = None  # wandb group (multirun jobs default to the sweep directory)
    tags: list[str] = field(default_factory=list)  # wandb tags
    console_every: int = 1  # print one console line every N steps

    def __post_init__(self) -> None:
        _check(self.console_every >= 1, "logger.console_every must be >= 1")


@dataclass
class SandboxConfig:
    """Limits of every run of model-written code (the code_tests reward, the Python tool): envs/sandbox.py."""

    cpu_s: float = 5.0  # CPU seconds per program (SIGXCPU, then SIGKILL a second later)
    wall_s: float = 10.0  # wall-clock seconds per program before its process group is killed
    memory_mb: int = 512  # address space per program, MiB
    max_procs: int = 1  # 1: no child processes (threads allowed); above 1: RLIMIT_NPROC (not enforced for root)
    max_output_bytes: int = 65536  # stdout + stderr per program; the program is killed past it
    workers: int = 2  # programs run at once when a batch is scored (threads, each waiting on its own process)

    def __post_init__(self) -> None:
        from envs.sandbox import SandboxLimits

        _check(self.workers >= 1, f"sandbox.workers must be >= 1 (got {self.workers})")
        try:
            SandboxLimits(**{k: v for k, v in self.__dict__.items() if k != "workers"})
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # reward/env are `_target_` nodes instantiated by train.py (their keyword arguments vary by target)
    reward: Any = field(default_factory=dict)
    env: Any = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # limits of model-written code (docs/sandbox.md)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    seed: int = 0  # seeds python, numpy, torch, the data order, the rollout engine and every prompt's sampling
    deterministic: bool = False  # deterministic learner kernels; on GPUs also vLLM's batch-invariant mode (slower)
    verbose: bool = False  # show vLLM's and Ray's own log lines on the console (always in <run dir>/logs/)
    steps: int = 24  # training steps (one rollout batch + update + adapter sync each)
    prompts_per_step: int = 8  # prompts per step; each gets algorithm.group_size completions
    micro_batch_size: int = 16  # sequences per padded learner forward/backward (micro_batch_tokens 0, or auto+Unsloth)
    micro_batch_tokens: int | None = None  # >0: packed rows of <= N tokens; 0: padded; null: auto (PEFT packs)
    packed_attention: PackedAttention = PackedAttention.auto  # packed rows' attention: auto | sdpa | varlen (CUDA)
    share_prompt_prefix: bool = True  # learner runs each prompt once per group (packed row; padded: KV cache, CPU only)
    eval_size: int = 64  # held-out prompts evaluated before and after training (0 disables evaluation)
    eval_interval: int = 0  # also evaluate every N steps (0: only before and after training)
    eval_n_samples: int = 0  # completions sampled per eval prompt for pass@k (0: greedy accuracy only)
    eval_temperature: float = 1.0  # sampling temperature of those eval samples (greedy accuracy always uses 0)
    eval_pass_k: list[int] = field(default_factory=lambda: [1])  # k of eval/pass@k (each <= eval_n_samples)
    eval_correct_threshold: float = 1.0  # reward >= this counts as correct (lower it for partial-credit rewards)
    eval_save_dir: str | None = None  # per-sample eval jsonl, one step_N.jsonl per evaluation (null: <run dir>/eval)
    rollout_save_interval: int = 0  # write every completion of every N-th step to a jsonl (0: never)
    rollout_save_dir: str | None = None  # where those step_N.jsonl go (null: <run dir>/rollouts)
    sync_probe_threshold: float = 0.2  # fail when the sync probe's mean |dlogp| exceeds its pre-training floor + this
    output_dir: str | None = None  # run directory (null: Hydra's run directory)
    save_interval: int = 5  # checkpoint every N steps and after the last one, in <run dir>/checkpoints (0: never)
    keep_last: int = 2  # checkpoints kept; older ones are deleted after each save (0: keep all)
    max_nonfinite_steps: int = 3  # stop the run after this many steps in a row with a NaN/inf loss (each is skipped)
    resume: str | None = None  # null: start fresh | auto: latest checkpoint in output_dir | a checkpoints/step_N path
    plan: bool = False  # print the GPU map and a memory estimate per role, then exit (nothing starts; rl/preflight/plan.py)
    plan_gpu_memory_gib: float | None = None  # GPU memory plan=true assumes per GPU (null: nvidia-smi's, else 80)

    def __post_init__(self) -> None:
        _check(self.steps >= 0, f"steps must be >= 0 (got {self.steps})")
        _check(self.prompts_per_step >= 1, f"prompts_per_step must be >= 1 (got {self.prompts_per_step})")
        _check(self.micro_batch_size >= 1, f"micro_batch_size must be >= 1 (got {self.micro_batch_size})")
        _check(
            self.micro_batch_tokens is None or self.micro_batch_tokens >= 0,
            "micro_batch_tokens must be >= 0 (0: micro_batch_size padded sequences) or null (auto); "
            f"got {self.micro_batch_tokens}",
        )
        _check(
            self.packed_attention != PackedAttention.varlen or self.cluster.use_gpu,
            "packed_attention=varlen runs a CUDA flash kernel: set cluster.use_gpu=true, or packed_attention=sdpa",
        )
        _check(self.eval_size >= 0, f"eval_size must be >= 0 (got {self.eval_size})")
        _check(
            self.eval_interval >= 0, f"eval_interval must be >= 0 (0: only before and after; got {self.eval_interval})"
        )
        _check(self.eval_n_samples >= 0, f"eval_n_samples must be >= 0 (0: greedy only; got {self.eval_n_samples})")
        _check(self.eval_temperature > 0, f"eval_temperature must be > 0 (got {self.eval_temperature})")
        _check(
            all(1 <= k <= max(self.eval_n_samples, 1) for k in self.eval_pass_k),
            f"eval_pass_k={list(self.eval_pass_k)} needs 1 <= k <= eval_n_samples={self.eval_n_samples} (pass@k is "
            f"estimated from eval_n_samples samples per prompt): set eval_n_samples>={max(self.eval_pass_k, default=1)} "
            "or drop the larger k",
        )
        _check(
            self.rollout_save_interval >= 0,
            f"rollout_save_interval must be >= 0 (0: never; got {self.rollout_save_interval})",
        )
        _check(self.save_interval >= 0, f"save_interval must be >= 0 (0: no checkpoints; got {self.save_interval})")
        _check(
            self.plan_gpu_memory_gib is None or self.plan_gpu_memory_gib > 0,
            f"plan_gpu_memory_gib must be > 0 or null (got {self.plan_gpu_memory_gib})",
        )
        _check(self.max_nonfinite_steps >= 1, f"max_nonfinite_steps must be >= 1 (got {self.max_nonfinite_steps})")
        _check(self.keep_last >= 0, f"keep_last must be >= 0 (0: keep every checkpoint; got {self.keep_last})")
        _check(
            self.resume != "auto" or self.output_dir is not None,
            "resume=auto looks for checkpoints in output_dir: set output_dir=<the run directory to continue>",
        )
        _check(
            self.cluster.weight_sync == WeightSync.object_store
            or self.model.full_finetune
            or self.cluster.lora_mode != LoraMode.native,
            "cluster.weight_sync=ipc merges the adapter into the engine's weights, which cluster.lora_mode=native "
            "does not: set cluster.lora_mode=merged (or auto)",
        )
        m, a, c = self.model, self.algorithm, self.cluster
        if not c.use_gpu and (m.learner_backend == LearnerBackend.unsloth or m.load_in_4bit):
            what = (
                "model.learner_backend=unsloth"
                if m.learner_backend == LearnerBackend.unsloth
                else "model.load_in_4bit=true"
            )
            raise ConfigError(
                f"{what} needs CUDA GPUs: set cluster.use_gpu=true on a GPU machine, or model.learner_backend=peft "
                "model.load_in_4bit=false"
            )
        _check(
            not a.overlong_penalty or a.overlong_buffer is None or a.overlong_buffer <= m.max_new_tokens,
            f"algorithm.overlong_buffer={a.overlong_buffer} exceeds model.max_new_tokens={m.max_new_tokens}: lower it "
            "(null: a quarter of model.max_new_tokens)",
        )
        samples, learners = self.prompts_per_step * self.algorithm.group_size, self.cluster.num_learners
        _check(
            samples % learners == 0,
            f"prompts_per_step * algorithm.group_size = {self.prompts_per_step} * {self.algorithm.group_size} = "
            f"{samples} samples do not split evenly over cluster.num_learners={learners}: make prompts_per_step "
            f"a multiple of {learners // math.gcd(learners, self.algorithm.group_size)} (each learner then gets "
            f"whole prompt groups when it is a multiple of {learners}) or change cluster.num_learners",
        )


@dataclass
class EvalCommandConfig(TrainConfig):
    """`python -m rl.tools.eval` (conf/eval.yaml): the training config (the same groups and eval_* keys, so a run's
    overrides evaluate it as it was trained) plus what to evaluate and where to write it."""

    adapter: str | None = (
        None  # trained policy: adapter folder, run dir, checkpoints/step_N or HF model folder (null: base only)
    )
    compare_base: bool = True  # with `adapter`, also evaluate the base model (model.path) and print both side by side
    eval_only: list[str] = field(default_factory=list)  # evaluate only these named eval sets (empty: all of the env's)
    eval_out: str | None = None  # folder for results.json and the per-sample jsonl (null: outputs/eval/<date>/<time>)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.eval_size > 0, f"eval_size must be > 0 for python -m rl.tools.eval (got {self.eval_size})")
        _check(
            self.adapter is not None or self.compare_base,
            "compare_base=false without adapter=... evaluates nothing: give adapter=<adapter folder, run dir or checkpoint>",
        )


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (called by train.py before composing)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="eval_schema", node=EvalCommandConfig)
