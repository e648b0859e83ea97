"""The choices a setting may take (str Enums: OmegaConf 2.3 has no Literal), each value with what it means.

Apart from rl/config/schema.py so that the schema reads as its groups and their checks; code that compares a
resolved value imports its enum from here.
"""

from __future__ import annotations

from enum import Enum


class ActorBase(str, Enum):
    learner = "learner"  # the actors serve the base the learner computes with (4-bit: its NF4 weights, dequantized)
    original = "original"  # the actors serve model.path's weights as they are (beside a 4-bit learner: a mismatch)
    # beside a 4-bit learner: vLLM quantizes model.path to NF4 itself, with the learner's settings (the same codes,
    # docs/benchmarks.md), and computes with bitsandbytes' kernels; the adapter is applied by vLLM's LoRA (native)
    quantized = "quantized"


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    auto = "auto"  # bfloat16 where the roles compute it natively, else float32 (resolved in rl/resolve.py)


class ClusterMode(str, Enum):
    ray = "ray"  # rollout actors and learners are Ray actors (local Ray started when address is null)
    local = "local"  # the same plain classes in this one process, without Ray (tests, debugging)


class RolloutMode(str, Enum):
    batch = "batch"  # a step's prompts are generated together (cluster.staleness k: sent k steps ahead)
    continuous = "continuous"  # fully asynchronous: actors never stop, the learner takes finished groups (stream.py)


class RolloutBackend(str, Enum):
    vllm = "vllm"  # vLLM engine (CPU build here, CUDA build on GPUs)
    hf = "hf"  # transformers `generate` (debugging; slow)


class LearnerBackend(str, Enum):
    auto = "auto"  # unsloth on CUDA when the package is installed, else peft (resolved in rl/resolve.py)
    peft = "peft"  # transformers + PEFT LoRA (any device; bitsandbytes NF4 with model.load_in_4bit on CUDA)
    unsloth = "unsloth"  # Unsloth FastLanguageModel (CUDA only)


class LoraMode(str, Enum):
    auto = "auto"  # = merged on every device (rl/resolve.py says why)
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
