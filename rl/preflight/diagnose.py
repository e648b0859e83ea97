"""Start-up failures in one line: which role failed, its root cause (rl/errors.py caught it), and the config key
(with a value, where one can be computed) that fixes it. The one place that turns a start-up error into what the
user reads: rl/app.py calls `explain` after a role failed to start; the training loop never imports it.

train.py prints the resulting `StartupError` as `error: <one line>` (exit 1) and writes the full traceback, the
role's included, to the run's log file (train.log). Each failure kind is one short function beside the vLLM
message it matches, in the order `explain` tries them.
"""

from __future__ import annotations

import math
import re

from rl.config.schema import TrainConfig
from rl.errors import shorten

GiB = 1024**3
MODEL_HINT = (
    "give a Hugging Face model folder with config.json, tokenizer files and *.safetensors weights, a hub id in the "
    "local cache, or embedded:smollm2-135m-instruct"
)


def explain(role: str, cause: str, cfg: TrainConfig, failed: str = "failed to start") -> str:
    """One line for a role that failed to start: `<role> failed to start: <cause>: <the fix>`. `cfg` is the
    run's resolved config (model path, memory settings, the step's size, for the suggested values). A judge/teacher
    engine is explained with its own engine config, and its memory key named."""
    if role.startswith("judge/teacher"):
        from rl.resolve import teacher_engine_config

        text = explain("engine", cause, teacher_engine_config(cfg), failed)
        key = "cluster.gpu_memory_utilization"
        return role + text.removeprefix("engine").replace(key, "cluster.teacher_memory_utilization")
    for rule in (_cpu_kv_cache, _cpu_share_not_free, _gpu_share_not_free, _kv_too_small, _cuda_oom, _host_oom,
                 _context_too_long, _lora_targets, _model_files):  # fmt: skip
        text = rule(cause, cfg)
        if text:
            return f"{role} {failed}: {text}"
    if "root cause above" in cause or "initialization failed" in cause:  # no engine output could be read back
        hint = _cpu_kv_hint(cfg)
        return (
            f"{role} {failed}: the vLLM engine did not start ({shorten(cause)}); its own error is in the engine's "
            f"output above{hint}"
        )
    return f"{role} {failed}: {shorten(cause, 400)} (full traceback: the run's train.log)"


def _kv_need(cfg: TrainConfig) -> tuple[float, int, int]:
    """(KV bytes, sequences, tokens each) one actor needs to hold its sequences at once
    (`TrainConfig.actor_sequences`; 0 bytes when the model's shape is unknown)."""
    from rl.preflight.shapes import DTYPE_BYTES, load_shape

    seqs = cfg.actor_sequences
    seq_len = cfg.max_seq_length
    try:
        shape, _ = load_shape(cfg.model.path)
    except Exception:  # noqa: BLE001 - the suggestion then covers the engine alone
        shape = None
    if shape is None:
        return 0.0, seqs, seq_len
    dtype = cfg.model.dtype.value  # resolved
    return float(seqs * seq_len * shape.kv_bytes_per_token(DTYPE_BYTES.get(dtype, 2))), seqs, seq_len


_CPU_KV = re.compile(
    r"Available memory on node (\d+) \(([\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than requested "
    r"memory for kv \((-?[\d.]+)/([\d.]+) GiB\)"
)


def _cpu_kv_cache(cause: str, cfg: TrainConfig) -> str | None:
    """vLLM CPU: the share of the NUMA node minus what the engine already uses leaves no KV cache (or more than
    the node has free)."""
    m = _CPU_KV.search(cause)
    if not m:
        return None
    from rl.preflight.memory import vllm_cpu_fraction

    node, available, total, kv, requested = m.group(1), *map(float, m.groups()[1:])
    used = requested - kv
    f = cfg.cluster.gpu_memory_utilization
    need, seqs, seq_len = _kv_need(cfg)
    fits = vllm_cpu_fraction(used * GiB, need, total * GiB)
    where = f"cluster.gpu_memory_utilization={f:g} gives the engine {requested:.2f} GiB of NUMA node {node}'s {total:.2f} GiB"
    if kv > available:
        return (
            f"not enough free memory for vLLM's KV cache ({kv:.2f} GiB wanted, {available:.2f} GiB available on "
            f"NUMA node {node}): {where}; free memory (other processes), or set cluster.gpu_memory_utilization="
            f"{fits:g} ({seqs} sequences of {seq_len} tokens at once)"
        )
    return (
        f"no memory left for vLLM's KV cache: {where} and the engine already uses {used:.2f} GiB without it "
        f"(vLLM: {kv:.2f} GiB left for the KV cache); set cluster.gpu_memory_utilization={fits:g} ({seqs} "
        f"sequences of {seq_len} tokens at once)"
    )


_CPU_SHARE = re.compile(
    r"Available memory on node (\d+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired CPU memory "
    r"utilization \(([\d.]+), ([\d.]+) GiB\)"
)


def _cpu_share_not_free(cause: str, cfg: TrainConfig) -> str | None:
    m = _CPU_SHARE.search(cause)
    if not m:
        return None
    node, available, total, f, requested = m.group(1), *map(float, m.groups()[1:])
    below = math.floor(100 * available / total) / 100
    return (
        f"cluster.gpu_memory_utilization={f:g} asks {requested:.2f} GiB of NUMA node {node}'s {total:.2f} GiB and only "
        f"{available:.2f} GiB is available (vLLM CPU checks this at start); set cluster.gpu_memory_utilization "
        f"below {below:g} (`plan=true` shows what the engine needs) or free memory"
    )


_GPU_SHARE = re.compile(
    r"Free memory on device (\S+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory "
    r"utilization \(([\d.]+), ([\d.]+) GiB\)"
)


def _gpu_share_not_free(cause: str, cfg: TrainConfig) -> str | None:
    m = _GPU_SHARE.search(cause)
    if not m:
        return None
    device, free, total, f, requested = m.group(1), *map(float, m.groups()[1:])
    below = math.floor(100 * free / total) / 100
    return (
        f"cluster.gpu_memory_utilization={f:g} asks {requested:.2f} GiB of GPU {device} and {free:.2f} of "
        f"{total:.2f} GiB is free (another process, or a role sharing the GPU, holds the rest); set "
        f"cluster.gpu_memory_utilization below {below:g}, or give the actor its own GPU (cluster.gpus_per_actor)"
    )


_KV_SMALL = re.compile(
    r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the available KV cache "
    r"memory \(([\d.]+) GiB\)"
)


def _kv_too_small(cause: str, cfg: TrainConfig) -> str | None:
    """vLLM (GPU or CPU): the KV cache exists but holds less than one max-length sequence, or nothing at all."""
    f = cfg.cluster.gpu_memory_utilization
    m = _KV_SMALL.search(cause)
    if m:
        seq_len, needed, have = int(m.group(1)), float(m.group(2)), float(m.group(3))
        suggestion = ""
        if not cfg.cluster.use_gpu:
            from rl.preflight.machine import numa_node_memory

            total = numa_node_memory().total / GiB
            suggestion = f"={math.ceil(100 * (f + 1.1 * (needed - have) / total)) / 100:g}"
        return (
            f"vLLM's KV cache ({have:.2f} GiB) cannot hold one {seq_len}-token sequence ({needed:.2f} GiB): raise "
            f"cluster.gpu_memory_utilization{suggestion} (now {f:g}) or lower model.max_prompt_tokens + "
            "model.max_new_tokens"
        )
    if "No available memory for the cache blocks" in cause:
        return (
            f"vLLM has no memory left for its KV cache at cluster.gpu_memory_utilization={f:g}: raise it "
            f"(`python train.py <your overrides> plan=true` shows what the engine needs){_cpu_kv_hint(cfg)}"
        )
    return None


def _cuda_oom(cause: str, cfg: TrainConfig) -> str | None:
    if not re.search(
        r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation", cause
    ):
        return None
    return (
        f"CUDA out of memory ({shorten(cause, 160)}): {_plan_memory(cfg)}`python train.py <your overrides> "
        "plan=true` shows each role's memory per GPU; give roles more GPU (cluster.gpus_per_actor, "
        "cluster.gpus_per_learner), lower cluster.gpu_memory_utilization where an actor shares its GPU, or lower "
        "learner.micro_batch_size / model.max_new_tokens, or set model.load_in_4bit=true"
    )


def _host_oom(cause: str, cfg: TrainConfig) -> str | None:
    if not re.search(
        r"running low on memory|OOM killer|Cannot allocate memory|std::bad_alloc|DefaultCPUAllocator", cause
    ):
        return None
    return (
        f"the machine ran out of memory ({shorten(cause, 160)}): `python train.py <your overrides> plan=true` shows "
        "each role's memory; lower cluster.gpu_memory_utilization, learner.micro_batch_size or the number of roles "
        "(cluster.num_actors, cluster.num_learners)"
    )


_MAX_LEN = re.compile(
    r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len \((\w+)=([\d.]+)"
)


def _context_too_long(cause: str, cfg: TrainConfig) -> str | None:
    """vLLM: the longest sequence the run asks for is longer than the model's context (as vLLM reads it from the
    model's config.json, rope scaling and tokenizer limit included)."""
    m = _MAX_LEN.search(cause)
    if not m:
        return None
    want, key, have = int(m.group(1)), m.group(2), int(float(m.group(3)))
    completion = "env.max_episode_tokens" if cfg.episodes else "model.max_new_tokens"
    return (
        f"a sequence of model.max_prompt_tokens + {completion} = {cfg.model.max_prompt_tokens} + "
        f"{cfg.completion_tokens} = {want} tokens is longer than the model at {cfg.model.path} takes ({key}={have} "
        f"in its config.json): lower {completion} or model.max_prompt_tokens so that they add up to {have} at most"
    )


def _lora_targets(cause: str, cfg: TrainConfig) -> str | None:
    """PEFT: no module of the model matches model.lora_targets (names from another architecture, a typo)."""
    if "NoMatchingPeftModuleError" not in cause and not re.search(r"Target modules .* not found in the base", cause):
        return None
    return (
        f"model.lora_targets={list(cfg.model.lora_targets)} names no module of the model at {cfg.model.path} "
        f"({shorten(cause, 160)}): set it to the model's projection names (Llama, Qwen, Mistral, SmolLM: q_proj, "
        "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
    )


_MODEL_FILES = re.compile(
    r"does not appear to have (?:a )?files? named|no file named|Cannot find any model weights|is not a local folder"
    r"|not a valid model identifier|Unrecognized model|does not recognize this architecture|are not supported for now"
    r"|Unrecognized configuration class|not a valid JSON|JSONDecodeError|Expecting (?:value|property name)"
    r"|SafetensorError|Error while deserializing header|HeaderTooLarge|incomplete metadata|HFValidationError"
    r"|RepositoryNotFoundError|LocalEntryNotFoundError|Can't load (?:the )?(?:tokenizer|config)"
    r"|couldn't connect to 'https://huggingface.co'|size mismatch for|Couldn't instantiate the backend tokenizer",
    re.IGNORECASE,
)


def _model_files(cause: str, cfg: TrainConfig) -> str | None:
    if not _MODEL_FILES.search(cause):
        return None
    return f"could not load the model at model.path={cfg.model.path} ({shorten(cause, 300)}): {MODEL_HINT}"


def _cpu_kv_hint(cfg: TrainConfig) -> str:
    """On CPU, `plan`'s estimate of the KV cache: '; set cluster.gpu_memory_utilization=X ...' when it predicts
    that the share leaves none, else ''."""
    if cfg.cluster.use_gpu or cfg.cluster.rollout_backend.value != "vllm":
        return ""
    from rl.preflight.machine import numa_node_memory
    from rl.preflight.memory import vllm_cpu_fraction, vllm_cpu_non_kv_bytes
    from rl.preflight.shapes import DTYPE_BYTES, load_shape

    try:
        shape, _ = load_shape(cfg.model.path)
        node = numa_node_memory()
    except Exception:  # noqa: BLE001 - no hint then
        return ""
    if shape is None:
        return ""
    dtype = cfg.model.dtype.value  # resolved
    non_kv = vllm_cpu_non_kv_bytes(shape.weight_bytes(DTYPE_BYTES.get(dtype, 2)))
    f = cfg.cluster.gpu_memory_utilization
    need, seqs, seq_len = _kv_need(cfg)
    if f * node.total - non_kv >= max(need / seqs, 1.0):  # room for one sequence: not this
        return ""
    fits = vllm_cpu_fraction(non_kv, need, node.total)
    return (
        f"; by plan=true's estimate cluster.gpu_memory_utilization={f:g} leaves it no KV cache on NUMA node "
        f"{node.node} ({node.total / GiB:.2f} GiB): set cluster.gpu_memory_utilization={fits:g}"
    )


def _plan_memory(cfg: TrainConfig) -> str:
    """'plan=true estimates actor X GiB, learner Y GiB of a Z GiB GPU; ' for a run's config, or ''."""
    try:
        from rl.preflight import memory, plan
        from rl.preflight.machine import detect_gpus
        from rl.preflight.shapes import load_shape

        shape, _ = load_shape(cfg.model.path)
        if shape is None:
            return ""
        found = detect_gpus()
        device = found[1] if found else plan.ASSUMED_GPU_GIB * GiB
        m, c = cfg.model, cfg.cluster
        roles = memory.estimate_memory(
            shape,
            use_gpu=c.use_gpu,
            device_bytes=device,
            actor_dtype=m.dtype.value,
            learner_dtype=m.learner_dtype.value,
            load_in_4bit=m.load_in_4bit,
            full_finetune=m.full_finetune,
            lora_rank=m.lora_rank,
            lora_targets=[] if m.full_finetune else list(m.lora_targets),
            max_prompt_tokens=m.max_prompt_tokens,
            max_new_tokens=m.max_new_tokens,
            micro_batch_size=cfg.learner.micro_batch_size,
            sequences_per_actor=cfg.actor_sequences,
            gpus_per_actor=c.gpus_per_actor,
            gpu_memory_utilization=c.gpu_memory_utilization,
            vllm=c.rollout_backend.value == "vllm",
            native_lora=c.lora_mode == "native",
            gradient_checkpointing=m.gradient_checkpointing,
        )
    except Exception:  # noqa: BLE001 - the line then points to plan=true only
        return ""
    actor, learner = roles["actor"], roles["learner"]
    return (
        f"plan=true estimates actor {(actor.budget or actor.total) / GiB:.1f} GiB ({cfg.cluster.gpus_per_actor:g} GPU), "
        f"learner {learner.total / GiB:.1f} GiB ({cfg.cluster.gpus_per_learner:g} GPU) of {device / GiB:.0f} GiB GPUs; "
    )
