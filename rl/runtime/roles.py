"""What each role must offer, as `typing.Protocol`s: the runtime calls its roles only through these methods, so a
reader (and a type checker) sees a role's whole interface in one place.

The runtime never calls a role by a method-name string: it hands a group the protocol's own function
(`group.submit(i, RolloutActor.generate, prompts, sampling)`), and the group (rl/runtime/groups.py in this process,
rl/runtime/placement.py's RayGroup for Ray actors) calls the member's method of that name. A misspelt method is
then an AttributeError when the module loads, and the fakes in the tests implement the same protocols.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeAlias, TypeVar

from rl.types import Adapter, PromptRollout, Sampling, TrainSample


class RolloutActor(Protocol):
    """An inference engine with an adapter slot (rl/rollout/: vLLM, or transformers for debugging)."""

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        items: list[dict] | None = None,
    ) -> list[PromptRollout]:
        """Sample `sampling.n` completions per prompt (multi-turn envs: run an episode from each item), each
        prompt's samples drawn from its own seed; every rollout carries the adapter version it was made with."""
        ...

    def continue_samples(
        self, prompts: list[list[int]], sampling: Sampling, caps: list[int], seeds: list[int]
    ) -> list[PromptRollout]:
        """One segment of a continuous rollout: one completion per prompt (each a prompt with the tokens its sample
        has so far) of at most caps[i] new tokens, from seeds[i]; `sampling.n` is ignored."""
        ...

    def load_adapter(self, adapter: Adapter) -> dict:
        """Take a published adapter (or full weights) as the new version; returns {"seconds": ...}."""
        ...

    def load_weights_ipc(self, update_info: dict, version: int) -> dict:
        """Take learner 0's policy from CUDA IPC handles as `version`; returns {"seconds": ...}."""
        ...

    def sleep(self) -> dict:
        """Free the GPU memory (weights to host, KV cache dropped) while a colocated learner trains."""
        ...

    def wake_up(self) -> dict:
        """Take the GPU memory back before the next load or generate."""
        ...

    def state_dict(self) -> dict:
        """What a checkpoint must hold to resume this engine exactly (its RNG)."""
        ...

    def load_state(self, state: dict) -> None: ...

    def close(self) -> None: ...


class Learner(Protocol):
    """A policy being trained, with its optimizer (rl/learner/learner.py); learners step together, data-parallel."""

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step on these samples; returns the step's metrics."""
        ...

    def sequence_logprobs(
        self, prompts: list[list[int]], completions: list[list[int]], reference: bool = False
    ) -> list[list[float]]:
        """Per-token logprobs of each completion under the current policy (`reference`: with the adapter off)."""
        ...

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, seeds: list[int] | None = None
    ) -> list[PromptRollout]:
        """Learner generation (cluster.learner_chunk_size): sample with the learner's own model."""
        ...

    def init_process_group(self, address: str, port: int, world_size: int, rank: int) -> None: ...

    def get_adapter(self, for_sync: bool = False) -> Adapter:
        """The current adapter (`for_sync`: in the precision the actors load it at)."""
        ...

    def get_version(self) -> int: ...

    def ipc_weights(self) -> dict:
        """CUDA IPC handles of the policy, kept alive until `release_ipc_weights`."""
        ...

    def release_ipc_weights(self) -> None: ...

    def state_dict(self) -> dict:
        """What a checkpoint must hold to resume training exactly (adapter, optimizer, RNG)."""
        ...

    def load_state(self, state: dict) -> None: ...

    def adapter_checksum(self) -> float:
        """A number that differs when two learners' adapters differ (data-parallel learners must agree)."""
        ...

    def close(self) -> None: ...


class Teacher(Protocol):
    """A judge/teacher engine (rl/rollout/teacher.py): verdicts as text, logprobs of another model's tokens."""

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        items: list[dict] | None = None,
    ) -> list[PromptRollout]:
        """A judge's verdicts: `sampling.n` completions per prompt (their `text`)."""
        ...

    def token_logprobs(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """log p_teacher of each completion token after its prompt, one list per (prompt, completion) pair."""
        ...

    def close(self) -> None: ...


R = TypeVar("R")  # a role (one of the protocols above)
P = ParamSpec("P")  # a method's parameters after `self`
T = TypeVar("T")  # what a method returns

# A protocol's function, e.g. `RolloutActor.generate`: the group calls the member's method of its name. Written as
# `Method[R, P, T]`, a group's `submit(i, method, *args)` is checked against the method's own parameters and role;
# `Method[R, ..., T]` where the arguments travel as a stored tuple (a call sent again to another actor).
Method: TypeAlias = Callable[Concatenate[R, P], T]
