"""Continuous generation (`cluster.rollout_mode=continuous`): the actors never wait for the learner, and the learner
takes prompt groups as they finish, under a per-sample staleness bound.

AReaL's fully asynchronous mode (Fu et al. 2025) and PipelineRL's in-flight weight updates (Piché et al. 2025), in
the shape of this runtime, where a rollout actor runs its calls one at a time, in the order they were sent:
- Each sample is generated in segments of at most `cluster.segment_tokens` new tokens, each segment one request
  that carries the prompt and the sample's tokens so far (vLLM's prefix cache reads that prefix back instead of
  computing it, unless an adapter load has just emptied the cache). At most `STREAM_DEPTH` calls are queued on an
  actor (rl/config/cluster.py), so an adapter load sent by a sync runs right after them: the samples in progress
  pause at a segment's end, continue under the new adapter (a partial rollout), and each token records the version
  that sampled it (`Completion.versions`).
- Up to `groups_in_flight` prompt groups are generated or waiting for the learner at once (finished groups count,
  so generation does not run ahead of a slow learner); a group is ready when all its samples have stopped, in
  whatever order they finish: one long completion holds up its own group, not a batch.
- The staleness bound is per sample: a group with a sample whose oldest token is more than `bound` syncs older
  than the current adapter is dropped and counted, when a segment returns and again when the learner takes it.
- Multi-turn episodes run whole in one call (the env decides when a turn ends), every token with the call's
  version.
- An actor that dies during a segment: the segment goes to a live actor (rl/runtime/pool.py); no sample is lost.
The learner's side, the decoupled objective over these tokens, is `importance_terms` in rl/algorithms/losses.py.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from rl.config.cluster import STREAM_DEPTH
from rl.runtime.groups import MemberDied
from rl.runtime.pool import ActorPool, Call
from rl.runtime.roles import Method, RolloutActor
from rl.runtime.sync import Versions
from rl.seeds import segment_seed
from rl.types import Completion, PromptRollout, Sampling


@dataclass
class NewGroup:
    """A prompt drawn for generation: its tokens, env item and seed, and what its drawer needs back (`tag`)."""

    prompt: list[int]
    item: dict
    seed: int
    tag: Any = None


@dataclass
class _Sample:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None  # None while it is being generated
    episode: Completion | None = None  # a multi-turn env's whole episode


@dataclass
class StreamGroup:
    new: NewGroup
    samples: list[_Sample]
    actor: int = 0  # the actor of its last segment
    dropped: bool = False

    @property
    def done(self) -> bool:
        return all(s.finish is not None for s in self.samples)

    def oldest_version(self) -> int | None:
        versions = [min(s.versions) for s in self.samples if s.versions]
        return min(versions) if versions else None


@dataclass
class _InFlight:
    call: Call
    units: list[tuple[StreamGroup, int]]  # (group, sample index); -1: the group's whole episodes (multi-turn)
    method: Method[RolloutActor, ..., list[PromptRollout]]
    args: tuple  # sent again to a live actor when this one dies


class Stream:
    """Continuous generation over the live actors of `pool`. `draw()` gives the next prompt to generate (None: no
    more are wanted now); `decode` turns token ids into the texts the reward reads."""

    def __init__(
        self,
        pool: ActorPool[RolloutActor],
        versions: Versions,
        sampling: Sampling,
        *,
        segment_tokens: int,
        groups_in_flight: int,
        bound: int,
        episodes: bool,
        draw: Callable[[], NewGroup | None],
        decode: Callable[[list[list[int]]], list[str]],
    ):
        self.pool, self.versions, self.sampling = pool, versions, sampling
        self.segment_tokens, self.capacity, self.bound = segment_tokens, groups_in_flight, bound
        self.episodes, self.draw, self.decode = episodes, draw, decode
        self.active: list[StreamGroup] = []  # being generated
        self.ready: deque[StreamGroup] = deque()  # every sample stopped; waiting for the learner
        self.pending: deque[tuple[StreamGroup, int]] = deque()  # units waiting for a call, oldest first
        self.calls: list[_InFlight] = []
        self.dropped: list[StreamGroup] = []  # dropped as stale since the drawer last asked (`pop_dropped`)
        self.counts = {"dropped_stale_groups": 0, "segments_continued": 0, "actor_calls": 0}

    # ------------------------------------------------------------------------------------------------ the learner's side

    def take(self, n: int, timeout_s: float = 0.05) -> list[StreamGroup]:
        """The first n groups to finish (fewer only when nothing more is drawn or generated), generating meanwhile."""
        while True:
            self._drop_stale_ready()
            if len(self.ready) >= n:
                return [self.ready.popleft() for _ in range(n)]
            if not self.active and not self.calls and not self._fill():
                return [self.ready.popleft() for _ in range(len(self.ready))]
            self.pump(timeout_s)

    def pump(self, timeout_s: float = 0.0) -> None:
        """Keep the actors busy: draw new prompts into free room, send waiting units, and fold in the calls that
        finished within `timeout_s` (the caller's wait, e.g. for the learner)."""
        self._fill()
        self._dispatch()
        self._collect(timeout_s)
        self._fill()
        self._dispatch()

    def rollout(self, g: StreamGroup) -> PromptRollout:
        """A finished group as the learner's PromptRollout: per-token versions, texts decoded from all its tokens."""
        if self.episodes:
            comps = cast(list[Completion], [s.episode for s in g.samples])  # a finished group has every episode
        else:
            texts = self.decode([s.tokens for s in g.samples])
            comps = [
                Completion(s.tokens, s.logprobs, s.finish or "length", t, versions=s.versions)
                for s, t in zip(g.samples, texts)
            ]
        oldest = g.oldest_version()
        return PromptRollout(list(g.new.prompt), comps, self.versions.current if oldest is None else oldest, g.actor)

    def lag(self, g: StreamGroup) -> int:
        """Syncs between the group's oldest token's adapter and the current one."""
        oldest = g.oldest_version()
        return 0 if oldest is None else self.versions.steps_behind(oldest)

    def pop_dropped(self) -> list[StreamGroup]:
        out, self.dropped = self.dropped, []
        return out

    def pop_counts(self) -> dict[str, float]:
        out = {f"async/{k}": float(v) for k, v in self.counts.items()}
        self.counts = dict.fromkeys(self.counts, 0)
        return out

    # ------------------------------------------------------------------------------------------------ generation

    def _fill(self) -> bool:
        """Draw new groups while there is room; whether any was drawn."""
        drew = False
        while len(self.active) + len(self.ready) < self.capacity:
            new = self.draw()
            if new is None:
                break
            g = StreamGroup(new, [_Sample() for _ in range(self.sampling.n)])
            self.active.append(g)
            self.pending.extend([(g, -1)] if self.episodes else [(g, k) for k in range(self.sampling.n)])
            drew = True
        return drew

    def _dispatch(self) -> None:
        """Send waiting units: an idle actor takes what there is; one with a call running takes a second only when
        it would be a full-sized call (a small call behind a big one would run as many decode steps for a few
        samples)."""
        self.pool.rejoin(wait=not self.calls)  # nothing in flight: wait for an actor to come back
        live = self.pool.live()
        units_per_actor = self.capacity * (1 if self.episodes else self.sampling.n) / max(len(live), 1)
        size = max(1, math.ceil(units_per_actor / STREAM_DEPTH))
        busy = {i: sum(f.call.actor == i for f in self.calls) for i in live}
        for i in sorted(live, key=lambda i: busy[i]):
            while self.pending and busy[i] < STREAM_DEPTH:
                self._skip_dropped()
                if not self.pending or (busy[i] and len(self.pending) < max(1, size // 2)):
                    break
                units = [self.pending.popleft() for _ in range(min(size, len(self.pending)))]
                units = [u for u in units if not u[0].dropped]
                if units:
                    self._send(i, units)
                    busy[i] += 1

    def _skip_dropped(self) -> None:
        while self.pending and self.pending[0][0].dropped:
            self.pending.popleft()

    def _send(self, actor: int, units: list[tuple[StreamGroup, int]]) -> None:
        if self.episodes:
            groups = [g for g, _ in units]
            method: Method[RolloutActor, ..., list[PromptRollout]] = RolloutActor.generate
            args: tuple = ([g.new.prompt for g in groups], self.sampling, [g.new.seed for g in groups],
                           [g.new.item for g in groups])  # fmt: skip
        else:
            method = RolloutActor.continue_samples
            samples = [g.samples[k] for g, k in units]
            prompts = [g.new.prompt + s.tokens for (g, _), s in zip(units, samples)]
            caps = [min(self.segment_tokens, self.sampling.max_tokens - len(s.tokens)) for s in samples]
            seeds = [segment_seed(g.new.seed, k, len(s.tokens)) for (g, k), s in zip(units, samples)]
            args = (prompts, replace(self.sampling, n=1), caps, seeds)
        self.calls.append(_InFlight(self.pool.submit(actor, method, *args), units, method, args))
        self.counts["actor_calls"] += 1

    def _collect(self, timeout_s: float) -> None:
        if not self.calls:
            return
        done = set(self.pool.wait([f.call for f in self.calls], timeout_s))
        finished = [f for k, f in enumerate(self.calls) if k in done]
        self.calls = [f for k, f in enumerate(self.calls) if k not in done]
        for f in finished:
            self._fold(f)

    def _fold(self, f: _InFlight) -> None:
        try:
            rollouts = self.pool.result(f.call)
        except MemberDied as e:  # its units go to a live actor, as they were
            self.calls.append(replace(f, call=self.pool.resend(f.call, f.method, f.args, e, len(f.units))))
            return
        for (g, k), r in zip(f.units, rollouts):
            if r.adapter_version not in self.versions.published:
                self.versions.mismatch(f.call.actor, r.adapter_version)
            if g.dropped:
                continue
            g.actor = f.call.actor
            if k < 0:
                for s, c in zip(g.samples, r.completions):
                    versions = [r.adapter_version] * len(c.token_ids)
                    s.episode = replace(c, versions=versions)
                    s.tokens, s.versions, s.finish = c.token_ids, versions, c.finish_reason
            else:
                self._extend(g, k, r.completions[0], r.adapter_version)
            if self.lag(g) > self.bound:
                self._drop(g)
            elif g.done:
                self.active.remove(g)
                self.ready.append(g)

    def _extend(self, g: StreamGroup, k: int, c: Completion, version: int) -> None:
        s = g.samples[k]
        s.tokens = s.tokens + list(c.token_ids)
        s.logprobs = s.logprobs + list(c.logprobs)
        s.versions = s.versions + [version] * len(c.token_ids)
        if c.finish_reason != "length" or len(s.tokens) >= self.sampling.max_tokens or not c.token_ids:
            s.finish = c.finish_reason
        else:  # paused at the segment's end: continued by a later call, under whatever adapter the actor has then
            self.pending.append((g, k))
            self.counts["segments_continued"] += 1

    def _drop(self, g: StreamGroup) -> None:
        g.dropped = True
        if g in self.active:
            self.active.remove(g)
        self.dropped.append(g)
        self.counts["dropped_stale_groups"] += 1

    def _drop_stale_ready(self) -> None:
        for g in [g for g in self.ready if self.lag(g) > self.bound]:
            self.ready.remove(g)
            self._drop(g)
