"""Plain data that crosses process boundaries (Ray object store, pickling): no tensors, no config objects."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Sampling:
    """How to sample completions for one generate call (made by `sampling_for` in rl/config/schema.py).

    The filters are named as vLLM's SamplingParams and transformers' `generate` name them, and the engines pass
    `filters()` on whole: a new filter is a field here and its value in `sampling_for`, no engine changes."""

    n: int = 1  # completions per prompt
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    min_p: float = 0.0  # drop tokens less likely than min_p x the likeliest one, after temperature (0 off)
    max_tokens: int = 64

    def filters(self) -> dict[str, float]:
        """What shapes the distribution sampled from (the behaviour logprobs describe it after these)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "min_p": self.min_p}


@dataclass
class EpisodeInfo:
    """What a multi-turn episode (rl/rollout/episodes.py) adds to its Completion: counts, reward terms, transcript."""

    turns: int  # model turns
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_calls: int = 0  # tool calls the env could not parse (in tool_errors too)
    tool_seconds: float = 0.0
    env_tokens: int = 0  # environment tokens in the completion (mask 0)
    terms: dict[str, float] = field(default_factory=dict)  # per-episode reward terms, added to the outcome reward
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation after the prompt
    reward_errors: int = 0  # reward terms that were no finite number, scored 0 (__post_init__)

    def __post_init__(self) -> None:
        """A term goes into the loss, where one NaN spoils the whole batch: a term from any source (an env's, an
        agent's reward) that is no finite number scores 0 and is counted in `reward_errors` (logged as
        `env/reward_errors`, as rewards/runner.py counts a reward function's failures)."""
        for name, value in self.terms.items():
            try:
                x = float(value)
            except (TypeError, ValueError, OverflowError):
                x = math.nan
            if not math.isfinite(x):
                self.reward_errors += 1
            self.terms[name] = x if math.isfinite(x) else 0.0


@dataclass
class Completion:
    token_ids: list[int]  # sampled token ids, exactly as generated (never re-tokenised); episodes: env tokens too
    logprobs: list[float]  # behaviour logprob of each sampled token under the sampling policy (0.0 on env tokens)
    finish_reason: str  # "stop" (EOS / stop string / episode done) or "length" (hit max_tokens or the episode budget)
    text: str  # what the reward scores: the completion; an episode's last model turn
    mask: list[int] | None = None  # per token: 1 model token, 0 environment token (None: all model tokens)
    episode: EpisodeInfo | None = None  # multi-turn episodes only
    # per token: the adapter version that sampled it (cluster.rollout_mode=continuous, where a sample can span an
    # update); None: every token is the rollout's adapter_version
    versions: list[int] | None = None

    @property
    def model_tokens(self) -> int:
        """Tokens the model generated (the loss's tokens; what length penalties and filters count)."""
        return len(self.token_ids) if self.mask is None else sum(self.mask)


@dataclass
class PromptRollout:
    prompt_ids: list[int]
    completions: list[Completion]
    adapter_version: int  # the LoRA version the actor generated with (0 = base model; continuous: the oldest token's)
    actor: int = 0  # index of the rollout actor that produced it (-1 - j: learner j, cluster.learner_chunk_size)


@dataclass
class Adapter:
    """A LoRA adapter in PEFT format, as bytes: travels through Ray's object store, no shared filesystem."""

    version: int
    config: dict[str, Any]  # adapter_config.json contents
    weights: bytes  # adapter_model.safetensors contents
    export_s: float = 0.0  # seconds the learner took to make these bytes (a sync's metrics split its time by it)

    @property
    def nbytes(self) -> int:
        return len(self.weights)

    @classmethod
    def from_folder(cls, folder: str | Path, version: int) -> Adapter:
        """A PEFT-format adapter folder (rl/loop/checkpoint.py write_adapter's, or PEFT's save_pretrained)."""
        folder = Path(folder)
        config = json.loads((folder / "adapter_config.json").read_text())
        return cls(version, config, (folder / "adapter_model.safetensors").read_bytes())


@dataclass
class TrainSample:
    """One completion ready for the learner."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]  # behaviour logprobs from the rollout engine, one per completion token
    advantage: float
    loss_mask: list[int] = field(default_factory=list)  # per completion token (empty = all ones)
    token_advantages: list[float] = field(default_factory=list)  # per-token terms added to `advantage` (distill)


def completions_of(rollouts: list[PromptRollout]) -> list[Completion]:
    """Every completion of a batch, flat, in rollout order (prompt by prompt, G completions each)."""
    return [c for r in rollouts for c in r.completions]


def prompts_of(rollouts: list[PromptRollout]) -> list[list[int]]:
    """The prompt ids of every completion of a batch, flat, aligned with `completions_of`."""
    return [r.prompt_ids for r in rollouts for _ in r.completions]


@dataclass(frozen=True)
class TrainedPolicy:
    """A trained policy found on disk (python -m rl.tools.eval): `adapter` is a PEFT-format folder loaded into the base
    model's engine (a LoRA adapter, or a full fine-tuning checkpoint's weights); `model` is a whole HF model folder
    (a full fine-tuning run's `model/` export) that the engine loads instead of the base model."""

    kind: str  # adapter | run | checkpoint | model: what the path given was
    adapter: Path | None = None
    model: Path | None = None

    def describe(self) -> str:
        return f"{self.kind} {self.adapter or self.model}"


@dataclass(frozen=True)
class EpisodeSpec:
    """A multi-turn environment as each rollout actor builds and runs it (envs/protocol.py, rl/rollout/episodes.py);
    filled from `env` by the resolve step (rl/resolve.py); it travels to every rollout actor."""

    env: str  # the env's config as JSON (`_target_` and keyword arguments, interpolations resolved)
    max_turns: int  # env.max_turns
    max_tokens: int  # env.max_episode_tokens: tokens after the prompt per episode, the model's and the env's
    use_chat_template: bool  # env messages are rendered with the chat template (else joined by newlines)
    # model.max_prompt_tokens: an agent's first prompt at most (rl/rollout/agents.py); None (a spec built by hand): no bound
    max_prompt_tokens: int | None = None


@dataclass(frozen=True)
class JobError:
    """A sweep pack job's part of a merged call that raised (its learner step, rl/learner/grouped.py): the job's
    own call raises `error` in its thread (rl/runtime/packed.py JobGroup.result), so the job fails alone while its
    pack mates get their results."""

    error: Exception

    @staticmethod
    def unwrap(value: Any) -> Any:
        """`value`, a job's part of a merged call's results; its error raised where it is a JobError."""
        if isinstance(value, JobError):
            raise value.error
        return value
