"""Generations in flight: prompts sharded over the live actors (and the learners' share), collected in prompt
order whatever died on the way, and rollouts older than the staleness bound generated again.

`submit_generate` sends without waiting, so that with `cluster.staleness` k the sampler (rl/loop/sampler.py) keeps
k steps of generation in flight while the learners train; `collect` waits for one. A prompt's seeds travel with
it wherever it goes (a re-sent prompt's included), so its samples do not depend on the actor or batch it lands in.

Learner generation (`cluster.learner_chunk_size`): the first chunk of each generate call's prompts goes to the
learners, which sample them with their own model concurrently with the actors instead of idling until the rollouts
arrive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rl.runtime.groups import Group, shard
from rl.runtime.pool import ActorPool, Call
from rl.runtime.roles import Learner, RolloutActor
from rl.runtime.sync import VersionMismatch, Versions
from rl.types import PromptRollout, Sampling


@dataclass
class PendingGeneration:
    """Generation sent to the actors and not yet collected (`Pipeline.submit_generate` / `Pipeline.collect`)."""

    parts: list[list[list[int]]]  # prompts per actor call, in prompt order (after the learners' share)
    sampling: Sampling
    calls: list[Call]
    seed_parts: list[list[int] | None]  # each part's per-prompt seeds (None: unseeded)
    learner_calls: list[Any] = field(default_factory=list)  # the learners' share (the first prompts), in order
    item_parts: Sequence[list[dict] | None] = field(default_factory=list)  # each call's items (multi-turn envs)


class Pipeline:
    def __init__(
        self,
        pool: ActorPool[RolloutActor],
        learners: Group[Learner],
        versions: Versions,
        *,
        learner_chunk_size: int,
        episodes: bool,
    ):
        self.pool, self.learners, self.versions = pool, learners, versions
        self.learner_chunk_size = learner_chunk_size  # prompts each learner generates per call (0: actors only)
        self.episodes = episodes  # a multi-turn env: the actors get each prompt's item and run episodes
        self.dropped_stale = 0  # async/dropped_stale (samples) since the last pop

    def submit_generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        items: list[dict] | None = None,
    ) -> PendingGeneration:
        """Send the prompts out without waiting: the first learner_chunk_size x learners to the learners, the rest
        sharded over the live actors. Calls queue behind each member's earlier calls, so an adapter load sent
        before applies to them and one sent after does not. `items` (the prompts' env items) go to the actors only
        with a multi-turn env, whose episodes start from them. `seeds` (one per prompt, rl/seeds.py
        prompt_seed) travel with their prompts; None samples unseeded."""
        n_learn = min(self.learner_chunk_size * len(self.learners), len(prompts))
        learner_parts = shard(prompts[:n_learn], len(self.learners)) if n_learn else []
        learner_seeds = _split_like(seeds, learner_parts)
        learner_calls = [
            self.learners.submit(j, Learner.generate, p, sampling, s)
            for j, (p, s) in enumerate(zip(learner_parts, learner_seeds))
            if p
        ]
        self.pool.rejoin(wait=True)
        live = self.pool.live()
        parts = shard(prompts[n_learn:], len(live))
        item_parts: Sequence[list[dict] | None] = (
            shard(items[n_learn:], len(live)) if self.episodes and items is not None else [None] * len(parts)
        )
        seed_parts = _split_like(seeds[n_learn:] if seeds is not None else None, parts)
        calls = [
            self.pool.submit(i, RolloutActor.generate, *_args(p, sampling, it, s))
            for i, p, it, s in zip(live, parts, item_parts, seed_parts)
        ]
        return PendingGeneration(parts, sampling, calls, seed_parts, learner_calls, item_parts)

    def collect(self, pending: PendingGeneration) -> list[PromptRollout]:
        """Wait for a submitted generation: all prompts' rollouts in prompt order, whatever died on the way."""
        out: list[PromptRollout] = []
        for j, handle in enumerate(pending.learner_calls):
            rollouts = self.learners.result(handle)
            for r in rollouts:
                if r.adapter_version not in self.versions.allowed():
                    raise VersionMismatch(
                        f"learner {j} generated with adapter version {r.adapter_version}, expected one of "
                        f"{self.versions.allowed()}: it is not the version the actors were sent"
                    )
                r.actor = -1 - j  # learners are -1, -2, ... in PromptRollout.actor
            out.extend(rollouts)
        for part, items, seeds, call in zip(pending.parts, pending.item_parts, pending.seed_parts, pending.calls):
            out.extend(self._finish_part(part, pending.sampling, call, items=items, seeds=seeds))
        return out

    def _finish_part(
        self,
        part: list[list[int]],
        sampling: Sampling,
        call: Call,
        again: bool = False,
        items: list[dict] | None = None,
        seeds: list[int] | None = None,
    ) -> list[PromptRollout]:
        call, rollouts = self.pool.result_or_resend(
            call, RolloutActor.generate, _args(part, sampling, items, seeds), len(part)
        )
        for r in rollouts:
            r.actor = call.actor
        stale = [k for k, r in enumerate(rollouts) if not self.versions.ok(call.actor, r.adapter_version)]
        if stale:
            if again:  # the adapter was re-sent before this call: the actor did not take it
                self.versions.mismatch(call.actor, rollouts[stale[0]].adapter_version)
            self.dropped_stale += sum(len(rollouts[k].completions) for k in stale)
            print(
                f"rollout actor {call.actor} generated {len(stale)} prompt(s) with adapter version "
                f"{rollouts[stale[0]].adapter_version}, older than the staleness bound (allowed "
                f"{self.versions.allowed()}): dropped (async/dropped_stale) and generated again",
                flush=True,
            )
            redo = [part[k] for k in stale]
            redo_items = [items[k] for k in stale] if items is not None else None
            redo_seeds = [seeds[k] for k in stale] if seeds is not None else None
            resent = self.pool.submit(call.actor, RolloutActor.generate, *_args(redo, sampling, redo_items, redo_seeds))
            fresh = self._finish_part(redo, sampling, resent, again=True, items=redo_items, seeds=redo_seeds)
            for k, r in zip(stale, fresh):
                rollouts[k] = r
        return rollouts


def _args(prompts: list[list[int]], sampling: Sampling, items: list[dict] | None, seeds: list[int] | None) -> tuple:
    """An actor's generate arguments (its signature: prompts, sampling, seeds=None, items=None), the trailing
    ones only when given: a single-turn unseeded call stays (prompts, sampling)."""
    if items is not None:
        return prompts, sampling, seeds, items
    return (prompts, sampling) if seeds is None else (prompts, sampling, seeds)


def _split_like(seeds: list[int] | None, parts: list[list]) -> list[list[int] | None]:
    """`seeds` cut into the lengths of `parts` (consecutive), or None for each part when unseeded."""
    if seeds is None:
        return [None] * len(parts)
    out: list[list[int] | None] = []
    start = 0
    for part in parts:
        out.append(seeds[start : start + len(part)])
        start += len(part)
    return out
