"""Preflight memory estimate: the bytes each role (learner, rollout actor, judge/teacher engine) needs.

The estimate is written out term by term (each term below is one function, with its source), so that a wrong
number can be traced to the term that made it; the model's shapes are shapes.py's, the machine's memory machine.py's,
and the report that checks the estimate against the GPUs or the NUMA node is plan.py's.

Nothing starts (no Ray, no vLLM, no torch). `estimate_memory` is a pure function of the shapes and flat settings,
for other code too (benchmarks projecting to N GPUs); `plan_for_config` reads a TrainConfig (LoRA or
`model.full_finetune`, 4-bit or not, gradient checkpointing).

What is counted, in bytes (an estimate: allocator slack, CUDA context and fragmentation come on top):
- weights: parameters from the shapes (embeddings, attention with GQA and optional q/k/v bias, SwiGLU MLP,
  norms, untied head) at the precision in use; 4-bit is bitsandbytes NF4 with double quantisation, 4.127 bits
  per weight of the blocks' linear layers (Dettmers et al. 2023, QLoRA, sec. 2), embeddings and head in bf16.
- learner: trainable parameters (LoRA A and B on every target module, fp32 as PEFT keeps them; or every weight
  when full fine-tuning), their gradients and AdamW's two moments (torch keeps them in the parameter's dtype);
  activations of one micro-batch of max-length sequences: the tensors autograd saves in a Llama-style block
  (norm inputs, q/k/v/o inputs and outputs, the four SwiGLU intermediates; 4h + 2q + 2kv + 4i values per token
  and layer; only the layer inputs plus one block when gradient checkpointing), plus the logits the learner
  keeps (all positions in the model dtype, then the completion positions' copy, fp32 copy and log-softmax).
  An upper bound for the learner's default learner.share_prompt_prefix=true, which runs each prompt once per group. With
  micro_batch_tokens > 0: one packed row of that many tokens (or one longer sequence), all of them counted as
  completion positions (an upper bound again).
- actor (vLLM): on GPU the engine takes cluster.gpu_memory_utilization of each of its GPUs; weights, the LoRA
  slot and a profiling peak (8192 batched tokens) come out of it and the rest is KV cache (2 x layers x kv
  heads x head_dim values per token). On CPU, as vLLM's CPU worker computes it (vllm/v1/worker/cpu_worker.py):
  the fraction is of the memory of one NUMA node (the node of the engine's first CPU, capped by a cgroup limit),
  and the KV cache is that share minus what the engine process already uses when it allocates the cache
  (libraries, buffers and weights: `vllm_cpu_non_kv_bytes`); vLLM refuses to start when the share exceeds the
  node's available memory or leaves no KV cache.
- judge/teacher engines (`cluster.num_teachers`): each a vLLM engine sized as an actor is, on `teacher.path`'s
  shape, with its own fraction (`cluster.teacher_memory_utilization`), no LoRA slot (rl/rollout/teacher.py merges
  `teacher.adapter` into the weights) and a context for a judge prompt or a student's prompt and completion; they
  are placed after the learners, on their own GPUs or sharing the last one (`cluster.gpus_per_teacher` < 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rl.config.schema import ConfigError
from rl.model_path import adapter_lora, lora_slot_rank
from rl.preflight.shapes import DTYPE_BYTES, ModelShape
from rl.resolve import (
    resolve_dtype,
    resolve_lora_mode,
    resolve_micro_batch_tokens,
    teacher_in_4bit,
)

GiB = 1024**3
# vLLM's default step tokens (max_num_batched_tokens: its profiling forward) and running sequences (max_num_seqs: the
# last-token logits of its profiling run) of an `LLM(...)` engine: on GPUs of 70 GiB and more (H100, H200) the larger
# pair (vLLM's EngineArgs.get_batch_defaults; an A100 80GB gets the smaller one there, which the plan overestimates)
VLLM_PROFILE = {"small": (8192, 256), "large": (16384, 1024)}
# A vLLM CPU engine's memory besides its KV cache, when it sizes the cache: VLLM_CPU_BASE_BYTES + VLLM_CPU_WEIGHT_FACTOR
# x its weights (libraries, buffers, the warm-up forward): at or above vllm-cpu 0.32's own report of it for three
# models from 7M to 0.4B parameters (docs/benchmarks.md); larger models are overestimated
VLLM_CPU_BASE_BYTES = 0.70 * GiB
VLLM_CPU_WEIGHT_FACTOR = 1.6


@dataclass
class RoleMemory:
    """Estimated memory of one actor or one learner: named parts in bytes, the budget it has, notes."""

    role: str
    parts: dict[str, float] = field(default_factory=dict)
    budget: float | None = None  # bytes this role may use (its GPUs' memory, or vLLM's reserved share)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def activation_bytes(
    shape: ModelShape, *, sequences: int, seq_len: int, completion_len: int, act_bytes: int, checkpointing: bool
) -> float:
    """Saved activations of one forward/backward over `sequences` x `seq_len` tokens (see the module docstring)."""
    tokens = sequences * seq_len
    per_block = 4 * shape.hidden + 2 * shape.q_dim + 2 * shape.kv_dim + 4 * shape.intermediate  # values per token
    saved = shape.layers * shape.hidden + per_block if checkpointing else shape.layers * per_block
    logits = tokens * shape.vocab * act_bytes + sequences * completion_len * shape.vocab * (act_bytes + 8)
    return tokens * saved * act_bytes + logits


def estimate_memory(
    shape: ModelShape,
    *,
    use_gpu: bool,
    device_bytes: float,
    actor_dtype: str,
    learner_dtype: str,
    load_in_4bit: bool,
    full_finetune: bool,
    lora_rank: int,
    lora_targets: list[str],
    max_prompt_tokens: int,
    max_new_tokens: int,
    micro_batch_size: int,
    sequences_per_actor: int,
    gpus_per_actor: float,
    gpu_memory_utilization: float,
    vllm: bool = True,
    native_lora: bool = True,
    gradient_checkpointing: bool | None = None,
    micro_batch_tokens: int = 0,
    actor_in_4bit: bool = False,
    pack_jobs: int = 1,
    grouped: bool = False,
    pack_micro_batches: int = 1,
) -> dict[str, RoleMemory]:
    """Memory of one rollout actor and one learner (bytes). `actor_dtype`, `learner_dtype`: resolved (rl/resolve.py
    resolve_dtype; plan_for_config resolves a config's). `device_bytes`: one GPU's memory, or the machine's RAM
    when `use_gpu` is false. `gradient_checkpointing` None means on with 4-bit (Unsloth's default), else off.
    `actor_in_4bit`: the engine holds the weights in NF4 (model.actor_base=quantized). `pack_jobs`: the jobs of a
    sweep pack sharing the roles (hydra/launcher=pack): one base, and per job an adapter and its AdamW moments on the
    learner and a LoRA slot on the engine; the gradients and activations are one job's at a time, or with `grouped`
    (the learner trains the jobs' steps together, rl/learner/grouped.py) every job's gradients and the activations of
    `pack_micro_batches` micro-batches of every job's rows (learner.pack_micro_batches)."""
    if load_in_4bit and full_finetune:
        raise ConfigError("model.load_in_4bit=true cannot be fully fine-tuned: set model.full_finetune=false (LoRA)")
    seq_len = max_prompt_tokens + max_new_tokens
    checkpointing = load_in_4bit if gradient_checkpointing is None else gradient_checkpointing
    learner_b = DTYPE_BYTES.get(learner_dtype, 2)

    learner = RoleMemory("learner")
    precision = "4-bit NF4" if load_in_4bit else learner_dtype
    learner.parts[f"weights ({precision})"] = shape.weight_bytes(learner_b, load_in_4bit)
    if full_finetune:
        trainable, train_b, label = shape.params, learner_b, f"full fine-tune, {learner_dtype}"
    else:
        trainable, train_b, label = shape.lora_params(lora_rank, lora_targets), 4, f"LoRA r={lora_rank}, fp32"
        learner.parts[f"LoRA weights ({label}{f', x{pack_jobs} jobs' if pack_jobs > 1 else ''})"] = (
            pack_jobs * trainable * train_b
        )
    together = pack_jobs if grouped else 1
    learner.parts[f"gradients{f' (x{together} jobs)' if together > 1 else ''}"] = together * trainable * train_b
    learner.parts[f"AdamW moments{f' (x{pack_jobs} jobs)' if pack_jobs > 1 else ''}"] = (
        2 * pack_jobs * trainable * train_b
    )
    rows = together * (pack_micro_batches if grouped else 1)  # micro-batches in one forward
    if micro_batch_tokens > 0:  # one packed row: the budget, or one longer sequence alone (grouped: one per job)
        row = max(micro_batch_tokens, seq_len) * rows
        batch = dict(sequences=1, seq_len=row, completion_len=row)
        what = f"one packed row of learner.micro_batch_tokens={micro_batch_tokens} (or one {seq_len}-token sequence)"
    else:
        batch = dict(sequences=micro_batch_size * rows, seq_len=seq_len, completion_len=max_new_tokens)
        what = f"learner.micro_batch_size={micro_batch_size} x {seq_len} tokens"
    if together > 1:
        what += f", x{together} jobs in one grouped step"
    if rows > together:
        what += f", x{rows // together} micro-batches a job (learner.pack_micro_batches)"
    learner.parts["activations"] = activation_bytes(shape, **batch, act_bytes=learner_b, checkpointing=checkpointing)
    learner.notes.append(
        f"{trainable / 1e6:.1f} M trainable ({label}); activations: {what}, gradient checkpointing "
        f"{'on' if checkpointing else 'off'}"
    )

    # vLLM sizes its slot at the smallest rank it allows that holds the adapter, not at the adapter's rank
    lora_slot = pack_jobs * shape.lora_params(lora_slot_rank(lora_rank), lora_targets) if native_lora else 0
    if not vllm:  # HF generate: the KV cache of the batch, nothing reserved
        actor, b, _ = engine_weights("actor", shape, actor_dtype, actor_in_4bit, lora_slot)
        actor.parts["KV cache (its sequences at once)"] = sequences_per_actor * seq_len * shape.kv_bytes_per_token(b)
        return {"actor": actor, "learner": learner}
    actor = engine_memory(
        shape,
        ACTOR_KEYS,
        use_gpu=use_gpu,
        device_bytes=device_bytes,
        dtype=actor_dtype,
        seq_len=seq_len,
        sequences=sequences_per_actor,
        gpus=gpus_per_actor,
        gpu_memory_utilization=gpu_memory_utilization,
        lora_params=lora_slot,
        in_4bit=actor_in_4bit,
        batches=pack_jobs,
    )
    return {"actor": actor, "learner": learner}


@dataclass(frozen=True)
class EngineKeys:
    """The keys that size a vLLM engine of one role, named in its notes and warnings."""

    role: str  # "actor" or "teacher"
    memory: str  # its memory fraction
    gpus: str  # its GPUs


ACTOR_KEYS = EngineKeys("actor", "cluster.gpu_memory_utilization", "cluster.gpus_per_actor")
TEACHER_KEYS = EngineKeys("teacher", "cluster.teacher_memory_utilization", "cluster.gpus_per_teacher")


def engine_weights(
    role: str, shape: ModelShape, dtype: str, in_4bit: bool, lora_params: int
) -> tuple[RoleMemory, int, float]:
    """A rollout or judge/teacher engine's memory so far: its weights in `dtype` (resolved: rl/resolve.py
    resolve_dtype) or 4-bit, and a LoRA slot of `lora_params` parameters (0: none). With the bytes per element and the
    weights' bytes."""
    eng = RoleMemory(role)
    b = DTYPE_BYTES.get(dtype, 2)
    weights = shape.weight_bytes(b, in_4bit)
    precision = "4-bit NF4" if in_4bit else dtype
    eng.parts[f"weights ({precision})"] = weights
    if lora_params:
        eng.parts["LoRA slot"] = lora_params * b
    return eng, b, weights


def vllm_profile(device_bytes: float, batches: int = 1) -> tuple[int, int]:
    """The tokens of vLLM's profiling forward and the sequences whose logits it computes, for an engine on one GPU of
    `device_bytes` running `batches` jobs' batches at once (a pack: rl/rollout/vllm.py pack_batch_limits, the
    sequences times the jobs, the tokens at least the sequences)."""
    tokens, seqs = VLLM_PROFILE["large" if device_bytes >= 70 * GiB else "small"]
    seqs *= batches
    return (max(tokens, seqs) if batches > 1 else tokens), seqs


def engine_memory(
    shape: ModelShape,
    keys: EngineKeys,
    *,
    use_gpu: bool,
    device_bytes: float,
    dtype: str,
    seq_len: int,
    sequences: int,
    gpus: float,
    gpu_memory_utilization: float,
    lora_params: int = 0,
    in_4bit: bool = False,
    batches: int = 1,
) -> RoleMemory:
    """Memory of one vLLM engine (a rollout actor, or a judge/teacher engine): its share of the device, the weights,
    a LoRA slot of `lora_params` parameters (0: none, or merged into the weights), the profiling peak on a GPU, and
    the KV cache the rest leaves, against the `sequences` x `seq_len` tokens it is asked to hold at once. `batches`: a
    pack's jobs, whose engine runs that many times vLLM's default sequences (rl/rollout/vllm.py pack_batch_limits)."""
    eng, b, weights = engine_weights(keys.role, shape, dtype, in_4bit, lora_params)
    kv_token = shape.kv_bytes_per_token(b)
    kv_needed = sequences * seq_len * kv_token
    if use_gpu:
        tp = max(1, math.ceil(gpus))
        reserved = gpu_memory_utilization * device_bytes * tp
        tokens, seqs = vllm_profile(device_bytes, batches)
        profile = tokens * (2 * shape.intermediate + 4 * shape.hidden) * b
        eng.parts["activations (vLLM profile peak)"] = profile + seqs * shape.vocab * 4
        kv = reserved - eng.total
        eng.budget = reserved
        eng.notes.append(
            f"vLLM takes {keys.memory}={gpu_memory_utilization:g} of {tp} GPU(s) = {reserved / GiB:.1f} GiB; the "
            "rest after weights is KV cache"
        )
    else:  # vLLM's CPU worker: the share of its NUMA node is the engine's whole memory, weights included
        reserved = gpu_memory_utilization * device_bytes
        non_kv = vllm_cpu_non_kv_bytes(weights) + eng.parts.get("LoRA slot", 0.0)
        eng.parts["engine process (libraries, buffers)"] = non_kv - eng.total
        kv = reserved - non_kv
        eng.budget = reserved
        eng.notes.append(
            f"vLLM CPU: {keys.memory}={gpu_memory_utilization:g} of the NUMA node's {device_bytes / GiB:.2f} GiB = "
            f"{reserved / GiB:.2f} GiB for the engine; it uses about {non_kv / GiB:.2f} GiB before its KV cache, "
            "the rest is KV cache"
        )
    eng.parts["KV cache"] = max(kv, 0.0)
    capacity = max(kv, 0.0) / kv_token
    eng.notes.append(
        f"KV cache holds {capacity:,.0f} tokens; {sequences} sequences x {seq_len} = {sequences * seq_len:,} tokens "
        f"at once per {keys.role} ({kv_needed / GiB:.2f} GiB)"
    )
    if capacity < seq_len and not use_gpu:
        fits = vllm_cpu_fraction(non_kv, kv_needed, device_bytes)
        eng.warnings.append(
            f"{keys.role}: vLLM's CPU engine would fail to start (no KV cache): {keys.memory}="
            f"{gpu_memory_utilization:g} gives it {reserved / GiB:.2f} GiB of the NUMA node's "
            f"{device_bytes / GiB:.2f} GiB and it uses about {non_kv / GiB:.2f} GiB before its KV cache; set "
            f"{keys.memory}={fits:g} ({sequences} sequences of {seq_len} tokens at once)"
        )
    elif capacity < seq_len:
        eng.warnings.append(
            f"{keys.role}: no room for one {seq_len}-token sequence in vLLM's KV cache ({max(kv, 0) / GiB:.2f} GiB): "
            f"raise {keys.memory} or {keys.gpus}, or lower model.max_new_tokens"
        )
    elif capacity < sequences * seq_len:
        eng.notes.append(f"only {capacity / seq_len:.0f} of {sequences} sequences fit at once: vLLM queues the rest")
    return eng


def vllm_cpu_non_kv_bytes(weights: float) -> float:
    """What a vLLM CPU engine's process uses when it sizes its KV cache, for `weights` bytes of weights (the
    estimate behind VLLM_CPU_BASE_BYTES; a failed start reports the real number, see rl/preflight/diagnose.py)."""
    return VLLM_CPU_BASE_BYTES + VLLM_CPU_WEIGHT_FACTOR * weights


def vllm_cpu_fraction(non_kv: float, kv_needed: float, node_total: float, headroom: float = 1.1) -> float:
    """The smallest cluster.gpu_memory_utilization (rounded up to 0.01) whose share of a NUMA node of `node_total`
    bytes holds an engine that uses `non_kv` bytes before its KV cache plus `kv_needed` bytes of KV cache, with
    `headroom` on the engine's own part (its use varies a little from start to start)."""
    return min(1.0, math.ceil(100 * (non_kv * headroom + kv_needed) / node_total - 1e-9) / 100)


def plan_for_config(
    cfg: Any,
    shape: ModelShape,
    device_bytes: float,
    teacher_shape: ModelShape | None = None,
    pack_jobs: int = 1,
    grouped: bool = False,
) -> dict[str, RoleMemory]:
    """`estimate_memory` for a TrainConfig, and with `cluster.num_teachers` one judge/teacher engine ("teacher"):
    `teacher_shape` (None: the student's `shape`) served as rl/rollout/teacher.py's `teacher_engine_config` does,
    with the adapter merged (no LoRA slot; on the actors' NF4 base in NF4 with a slot), its own memory fraction and
    a context for a judge prompt or a student's prompt + completion. Keys that may not exist yet are read with their
    defaults."""
    m, c = cfg.model, cfg.cluster

    def value(v: Any) -> str:  # str Enums to their names
        return str(getattr(v, "value", v))

    vllm = value(c.rollout_backend) == "vllm"
    samples = cfg.run.prompts_per_step * cfg.algorithm.group_size
    actor_dtype = resolve_dtype(value(m.dtype), bool(c.use_gpu)).value  # auto as the run resolves it
    roles = estimate_memory(
        shape,
        use_gpu=bool(c.use_gpu),
        device_bytes=device_bytes,
        actor_dtype=actor_dtype,
        learner_dtype=resolve_dtype(value(m.learner_dtype), bool(c.use_gpu)).value,
        load_in_4bit=m.load_in_4bit,
        full_finetune=m.full_finetune,
        lora_rank=m.lora_rank,
        lora_targets=list(m.lora_targets),
        max_prompt_tokens=m.max_prompt_tokens,
        max_new_tokens=m.max_new_tokens,
        micro_batch_size=cfg.learner.micro_batch_size,
        micro_batch_tokens=resolve_micro_batch_tokens(cfg),
        sequences_per_actor=cfg.actor_sequences,
        gpus_per_actor=c.gpus_per_actor,
        gpu_memory_utilization=c.gpu_memory_utilization,
        vllm=vllm,
        native_lora=vllm and resolve_lora_mode(cfg) == "native",
        gradient_checkpointing=m.gradient_checkpointing,
        actor_in_4bit=vllm and m.load_in_4bit and value(getattr(m, "actor_base", "learner")) == "quantized",
        pack_jobs=pack_jobs,
        grouped=grouped,
        pack_micro_batches=getattr(cfg.learner, "pack_micro_batches", 1),
    )
    teachers = getattr(c, "num_teachers", 0)
    if teachers:
        t = cfg.teacher
        context = max(t.max_prompt_tokens, m.max_prompt_tokens + m.max_new_tokens + 1) + t.max_new_tokens
        nf4 = vllm and teacher_in_4bit(cfg)  # the actors' NF4 base, its adapter in a LoRA slot
        rank, _, targets = adapter_lora(t.adapter) if nf4 and t.adapter else (0, 0, [])
        roles["teacher"] = engine_memory(
            teacher_shape or shape,
            TEACHER_KEYS,
            use_gpu=bool(c.use_gpu),
            device_bytes=device_bytes,
            dtype=actor_dtype,
            seq_len=context,
            sequences=math.ceil(samples / teachers),  # each engine scores (or judges) its share of the step
            gpus=c.gpus_per_teacher,
            gpu_memory_utilization=c.teacher_memory_utilization or c.gpu_memory_utilization,
            lora_params=(teacher_shape or shape).lora_params(lora_slot_rank(rank), targets) if rank else 0,
            in_4bit=nf4,
        )
    return roles
