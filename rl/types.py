"""Plain data that crosses process boundaries (Ray object store, pickling): no tensors, no config objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Sampling:
    """How to sample completions for one generate call."""

    n: int = 1  # completions per prompt
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_tokens: int = 64


@dataclass
class Completion:
    token_ids: list[int]  # sampled token ids, exactly as generated (never re-tokenised)
    logprobs: list[float]  # behaviour logprob of each sampled token under the sampling policy
    finish_reason: str  # "stop" (EOS / stop string) or "length" (hit max_tokens)
    text: str


@dataclass
class PromptRollout:
    prompt_ids: list[int]
    completions: list[Completion]
    adapter_version: int  # the LoRA version the actor generated with (0 = base model)
    actor: int = 0  # index of the rollout actor that produced it (-1 - j: learner j, cluster.learner_chunk_size)


@dataclass
class Adapter:
    """A LoRA adapter in PEFT format, as bytes: travels through Ray's object store, no shared filesystem."""

    version: int
    config: dict[str, Any]  # adapter_config.json contents
    weights: bytes  # adapter_model.safetensors contents

    @property
    def nbytes(self) -> int:
        return len(self.weights)


@dataclass
class TrainSample:
    """One completion ready for the learner."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]  # behaviour logprobs from the rollout engine, one per completion token
    advantage: float
    loss_mask: list[int] = field(default_factory=list)  # per completion token (empty = all ones)


def completions_of(rollouts: list[PromptRollout]) -> list[Completion]:
    """Every completion of a batch, flat, in rollout order (prompt by prompt, G completions each)."""
    return [c for r in rollouts for c in r.completions]


def prompts_of(rollouts: list[PromptRollout]) -> list[list[int]]:
    """The prompt ids of every completion of a batch, flat, aligned with `completions_of`."""
    return [r.prompt_ids for r in rollouts for _ in r.completions]


@dataclass(frozen=True)
class TrainedPolicy:
    """A trained policy found on disk (python -m rl.eval): `adapter` is a PEFT-format folder loaded into the base
    model's engine (a LoRA adapter, or a full fine-tuning checkpoint's weights); `model` is a whole HF model folder
    (a full fine-tuning run's `model/` export) that the engine loads instead of the base model."""

    kind: str  # adapter | run | checkpoint | model: what the path given was
    adapter: Path | None = None
    model: Path | None = None

    def describe(self) -> str:
        return f"{self.kind} {self.adapter or self.model}"
