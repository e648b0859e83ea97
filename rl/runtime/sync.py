"""Adapter sync: learner 0's adapter published to every live rollout actor as a new version, and the versions kept
honest.

Bounded staleness: with `cluster.staleness` k the actors may generate with any of the last k+1 published adapter
versions (`Versions.allowed`). A rollout from a version that was never published (or from the future) is a sync bug
and fails fast (VersionMismatch); one from a published version older than the bound is dropped and generated again
(rl/runtime/pipeline.py). The sync probe's calls (rl/loop/probe.py decides when) are here too: they compare the
actors' logprobs with learner 0's on the version just published.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, NoReturn

from rl.runtime.groups import Group
from rl.runtime.pool import ActorPool, Call
from rl.runtime.roles import Learner, RolloutActor
from rl.types import Adapter, PromptRollout, Sampling, completions_of, prompts_of


class VersionMismatch(RuntimeError):
    pass


class ProbeReading(NamedTuple):
    """A sync probe's answer: the mean |logp_learner - logp_actor| per token, the seconds spent waiting for the actors'
    probe samples (near 0 when the probe was read a step late) and the seconds of learner 0's scoring of them."""

    diff: float
    samples_s: float
    score_s: float


class Versions:
    """The adapter versions published so far, oldest first (the base model is version 0)."""

    def __init__(self, staleness: int):
        self.staleness = staleness
        self.published = [0]

    @property
    def current(self) -> int:
        return self.published[-1]

    def allowed(self) -> list[int]:
        return self.published[-(self.staleness + 1) :]

    def steps_behind(self, version: int) -> int:
        """How many syncs ago `version` was published (0: the current one)."""
        return len(self.published) - 1 - max(i for i, v in enumerate(self.published) if v == version)

    def ok(self, actor: int, version: int) -> bool:
        """True within the bound, False for a published version older than it; raises for any other version."""
        if version in self.allowed():
            return True
        if version in self.published:
            return False
        self.mismatch(actor, version)

    def mismatch(self, actor: int, version: int) -> NoReturn:
        expected = self.current if self.staleness == 0 else f"one of {self.allowed()}"
        raise VersionMismatch(
            f"rollout actor {actor} generated with adapter version {version}, expected {expected}: "
            "the adapter sync did not reach it"
        )


class AdapterSync:
    """Publishes learner 0's policy to the actors: as bytes through the object store (any device) or as CUDA IPC
    handles (`cluster.weight_sync=ipc`, actors on learner 0's GPU)."""

    def __init__(self, pool: ActorPool[RolloutActor], learners: Group[Learner], versions: Versions, weight_sync: str):
        self.pool, self.learners, self.versions, self.weight_sync = pool, learners, versions, weight_sync
        self.adapter_ref: Any = None  # the last published adapter (put once), re-sent to restarted actors
        self.loads: list[Call] = []  # adapter loads not yet collected (staleness > 0 does not wait for them)
        pool.welcome = self.welcome

    def adapter(self, for_sync: bool = False) -> Adapter:
        """Learner 0's current adapter (`for_sync`: in the precision the actors load it at)."""
        return self.learners.call(Learner.get_adapter, [(for_sync,)])[0]

    def sync(self) -> dict[str, float]:
        """Publish learner 0's adapter to every live rollout actor as a new version. The loads queue behind the
        actors' calls in flight; with staleness > 0 they are not waited for (sync/actor_load_s is then the
        previous sync's)."""
        if self.weight_sync == "ipc":
            return self._sync_ipc()
        t0 = time.perf_counter()
        adapter = self.adapter(for_sync=True)
        exported_s = time.perf_counter() - t0  # the learner's export and its return to this process
        loaded = self.collect_loads()
        self.adapter_ref = self.pool.actors.put(adapter)
        self.versions.published.append(adapter.version)
        self.loads = [self.pool.submit(i, RolloutActor.load_adapter, self.adapter_ref) for i in self.pool.live()]
        self.pool.rejoin(wait=False)  # a restarted actor that is ready again gets this adapter too
        if self.versions.staleness == 0:
            loaded = self.collect_loads()
        out = {
            "time/sync_s": time.perf_counter() - t0,
            "sync/adapter_mb": adapter.nbytes / 2**20,
            "time/sync_export_s": exported_s,
            "time/sync_learner_export_s": adapter.export_s,
            "sync/version": float(adapter.version),
        }
        if loaded:
            out["sync/actor_load_s"] = max(x["seconds"] for x in loaded)
        return out

    def _sync_ipc(self) -> dict[str, float]:
        """Learner 0's policy (full weights, or the adapter's packed factors) to every live actor through CUDA IPC
        handles, synchronously whatever the staleness: the learner keeps the tensors alive until every actor loaded
        them. An actor that Ray restarted gets the policy as bytes instead (`published_ref`)."""
        t0 = time.perf_counter()
        self.collect_loads()
        self.adapter_ref = None  # a restarted actor's copy of the previous version
        version = self.learners.call(Learner.get_version, [()])[0]
        info = self.learners.call(Learner.ipc_weights, [()])[0]
        exported_s = time.perf_counter() - t0
        try:
            calls = [self.pool.submit(i, RolloutActor.load_weights_ipc, info, version) for i in self.pool.live()]
            loads = [self.pool.result(c) for c in calls]
        finally:
            self.learners.call(Learner.release_ipc_weights, [()])
        self.versions.published.append(version)
        self.pool.rejoin(wait=False)  # learner 0 is at the published version now: restarted actors can take it
        return {
            "time/sync_s": time.perf_counter() - t0,
            "time/sync_export_s": exported_s,
            "sync/actor_load_s": max(x["seconds"] for x in loads),
            "sync/version": float(version),
        }

    def collect_loads(self) -> list[dict]:
        out = [result for _, result in self.pool.results(self.loads, "load_adapter")]
        self.loads = []
        return out

    def welcome(self, actor: int) -> bool:
        """A restarted actor answers again: queue the published adapter before any work. False while it cannot be
        taken back (ipc: learner 0 is past the published version; the next sync takes it back)."""
        ref = self.published_ref()
        if ref is None and self.weight_sync == "ipc" and self.versions.current > 0:
            return False
        if ref is not None:
            self.loads.append(self.pool.submit(actor, RolloutActor.load_adapter, ref))
        print(f"rollout actor {actor} is back after its restart; adapter version {self.versions.current} sent first")
        return True

    def published_ref(self) -> Any:
        """The published adapter for a restarted actor (None: the base model, version 0): what the last sync put in
        the object store; `cluster.weight_sync=ipc` puts nothing there, so learner 0's policy is fetched as bytes
        now, once per sync, if it is still the published version (with staleness > 0 the learner may be a step
        ahead, and a version from the future would fail the run). The version is asked first, so that a learner
        already ahead is not asked for its adapter's bytes; the adapter's own version is checked again, since the
        learner may step in between."""
        if self.adapter_ref is None and self.weight_sync == "ipc" and self.versions.current > 0:
            if self.learners.call(Learner.get_version, [()])[0] != self.versions.current:
                return None
            adapter = self.adapter(for_sync=True)
            if adapter.version == self.versions.current:
                self.adapter_ref = self.pool.actors.put(adapter)
        return self.adapter_ref

    def probe_submit(self, prompts: list[list[int]], sampling: Sampling, seeds: list[int] | None = None) -> list[Call]:
        """Start the sync probe on every live actor (it queues behind the adapter load of the last sync)."""
        self.pool.rejoin(wait=True)
        return [self.pool.submit(i, RolloutActor.generate, prompts, sampling, seeds) for i in self.pool.live()]

    def probe_finish(self, calls: list[Call]) -> ProbeReading:
        """Mean |logp_learner - logp_actor| over the probe's tokens, and the time its two halves took; call it
        before the learners step again. An actor that died meanwhile is left out of this probe (it is restarted and
        re-sent the adapter)."""
        current = self.versions.current
        t0 = time.perf_counter()
        per_actor = [(call.actor, rollouts) for call, rollouts in self.pool.results(calls, "the sync probe")]
        t1 = time.perf_counter()
        for i, rollouts in list(per_actor):
            for r in rollouts:
                if r.adapter_version != current and not self.versions.ok(i, r.adapter_version):
                    # an older published version: an actor restarted just before the probe; it is not compared
                    print(f"sync probe: rollout actor {i} answered with adapter version {r.adapter_version}; skipped")
                    per_actor.remove((i, rollouts))
                    break
                if r.adapter_version != current:
                    self.versions.mismatch(i, r.adapter_version)
        diffs: list[float] = []
        for _, rollouts in per_actor:
            diffs.extend(self._differences(rollouts))
        return ProbeReading(sum(diffs) / max(len(diffs), 1), t1 - t0, time.perf_counter() - t1)

    def _differences(self, rollouts: list[PromptRollout]) -> list[float]:
        completions = completions_of(rollouts)
        c_ids = [c.token_ids for c in completions]
        learner_lp = self.learners.call(Learner.sequence_logprobs, [(prompts_of(rollouts), c_ids)])[0]
        return [abs(x - y) for c, b in zip(completions, learner_lp) for x, y in zip(c.logprobs, b)]
