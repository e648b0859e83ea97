"""Rollouts sent ahead of training: bounded staleness (ColossalChat's `n_behind`; the one-step overlap of
AReaL/PipelineRL in its simplest form).

With `staleness` k the prompts of step t are sent to the actors when step t-k starts, so while the learners
train on step t the actors already generate steps t+1..t+k with the adapter of an earlier step (at most k
syncs old). Nothing here waits: each actor runs its calls in order, so an adapter load sent after a generation
applies to the generations sent after it. The importance ratio of the loss uses the behaviour logprobs the
actors return, so the policy that generated a sample is the one the ratio corrects for. k = 0 is the synchronous
loop (one batch in flight, sent at the start of its own step).

Checkpoints: prompts of batches still in flight at a checkpoint count as not consumed. `state_dict()` is the
data position before the oldest batch in flight, so a resumed run generates those prompts again (with the
checkpoint's adapter) and the data cursor never skips a prompt. (Prompts drawn by extra dynamic-sampling rounds
of a step after its successors were sent are then drawn once more: trained twice, never skipped.)
"""

from __future__ import annotations

from collections import deque
from typing import Any

from rl.runtime import PendingGeneration, Runtime
from rl.types import PromptRollout, Sampling


class RolloutQueue:
    def __init__(self, runtime: Runtime, data: Any, sampling: Sampling, n_prompts: int, staleness: int):
        self.runtime, self.data, self.sampling = runtime, data, sampling
        self.n_prompts, self.staleness = n_prompts, staleness
        self._pending: deque[tuple[dict, list[int], PendingGeneration]] = deque()

    def fill(self, steps_left: int) -> None:
        """Send batches until staleness + 1 are in flight (never more than the steps left need)."""
        while len(self._pending) < min(self.staleness + 1, steps_left):
            before = self.data.state_dict()
            idx = self.data.next_batch(self.n_prompts)
            sent = self.runtime.submit_generate([self.data.prompt_ids[i] for i in idx], self.sampling)
            self._pending.append((before, idx, sent))

    def take(self) -> tuple[list[int], list[PromptRollout]]:
        """The oldest batch: its prompt indices and rollouts (waits for it)."""
        _, idx, sent = self._pending.popleft()
        return idx, self.runtime.collect(sent)

    def state_dict(self) -> dict:
        """The data position a checkpoint saves: before the oldest batch still in flight (see the module doc)."""
        return self._pending[0][0] if self._pending else self.data.state_dict()
