"""What the driver trains from, as `typing.Protocol`s: a step's data comes from a `BatchSource`, either sampled and
scored rollouts (a `RolloutSource`: rl/loop/sampler.py's Sampler, rl/loop/continuous.py's ContinuousSampler) or the
demonstrations of algorithm=sft (rl/data/demos.py). The driver and the checkpoint reach a source only through
these methods, so a type checker holds each source to them.
"""

from __future__ import annotations

from typing import Protocol

from rl.loop.sampler import Batch


class BatchSource(Protocol):
    """A stream of training data with a position that a checkpoint saves and a resumed run restores."""

    @property
    def cursor(self) -> int:
        """Draws so far (the console and the checkpoint's manifest show it)."""
        ...

    def state_dict(self) -> dict:
        """The position a checkpoint saves: a resumed run neither skips nor repeats a trained item."""
        ...

    def load_state(self, state: dict) -> None: ...

    def pump(self) -> None:
        """Called in a loop while the learners step: a continuous rollout keeps its actors fed; a source that
        generates nothing meanwhile does nothing."""
        ...


class RolloutSource(BatchSource, Protocol):
    """A source of sampled and scored rollouts; the driver cannot tell the batch and the continuous one apart."""

    @property
    def overlapped(self) -> bool:
        """Whether the actors generate while the learners train (the sync probe is then read a step late)."""
        ...

    def next(self, step: int) -> Batch:
        """Step `step`'s scored, filtered batch of `run.prompts_per_step` prompt groups."""
        ...
