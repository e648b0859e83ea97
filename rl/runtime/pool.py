"""The roles of a run (rollout actors, learners) driven as one: sharding, adapter versions, sync, actor faults.

`Runtime` holds two groups of role members (rl/runtime/groups.py: in this process or Ray actors) and splits work among
them. The logic (sharding prompts, publishing the adapter, checking versions, replacing dead actors' work) is
written once, here.

Past 400 lines because generation, sync and the actor-fault path share the same version bookkeeping and calls in
flight; apart, each would need the others' private state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rl.runtime.groups import Group, MemberDied, merge_learner_metrics, shard, shard_groups
from rl.config.resolve import RuntimeSpec
from rl.types import Adapter, PromptRollout, Sampling, TrainSample, completions_of, prompts_of

REJOIN_TIMEOUT_S = 600.0  # how long to wait for a restarting actor when no other actor is live


class VersionMismatch(RuntimeError):
    pass


@dataclass
class _Call:
    actor: int
    epoch: int  # the actor's death count when the call was sent: a failure of an older epoch was already handled
    handle: Any


@dataclass
class PendingGeneration:
    """Generation sent to the actors and not yet collected (`Runtime.submit_generate` / `Runtime.collect`)."""

    parts: list[list[list[int]]]  # prompts per actor call, in prompt order (after the learners' share)
    sampling: Sampling
    calls: list[_Call]
    seed_parts: list[list[int] | None]  # each part's per-prompt seeds (None: unseeded)
    learner_calls: list[Any] = field(default_factory=list)  # the learners' share (the first prompts), in order
    item_parts: list[list[dict] | None] = field(default_factory=list)  # each call's items (multi-turn envs)


class Runtime:
    """Splits work over the roles and keeps the actors' adapter versions honest.

    Bounded staleness: with `staleness` k the actors may generate with any of the last k+1 published adapter
    versions. A rollout from a version that was never published (or from the future) is a sync bug and fails
    fast (VersionMismatch); one from a published version older than the bound (a restarted actor that had not
    got the adapter again yet) is dropped, counted in `async/dropped_stale` (samples) and its prompt generated
    again, so no prompt is lost.

    Fault tolerance: a rollout actor whose process dies during a call (MemberDied) is restarted by Ray (up to
    `actor_max_restarts` times); its prompts go to a live actor; the restarted one (a restart runs __init__ again:
    base model, version 0) gets no work until it answers again, and then the current adapter before anything
    else; a console line and `fault/actor_restarts` say so. A learner's death is not handled here: it ends the
    run (rl/driver.py). The probe of each sync is rl/runtime/probe.py's; the calls it makes are here.

    Learner generation (`learner_chunk_size`, DistRL-LLM): the first chunk of each generate call's prompts goes
    to the learners, which sample them with their own model concurrently with the actors.
    """

    def __init__(self, actors: Group, learners: Group, spec: RuntimeSpec | None = None):
        spec = spec or RuntimeSpec()
        self.actors, self.learners = actors, learners
        self.weight_sync = spec.weight_sync  # object_store (adapter/weights as bytes) | ipc (CUDA IPC handles)
        self.learner_chunk_size = spec.learner_chunk_size  # prompts each learner generates per call (0: actors only)
        self.episodes = spec.episodes  # a multi-turn env: the actors get each prompt's item and run episodes
        self.staleness, self.actor_max_restarts = spec.staleness, spec.actor_max_restarts
        self.colocate = spec.colocate  # actors sleep while the learners train (one GPU per actor/learner pair)
        self._published = [0]  # adapter versions published by sync(), oldest first; the base model is version 0
        self._adapter_ref: Any = None  # the last published adapter (put once), re-sent to restarted actors
        self._deaths = [0] * len(actors)
        self._gone: set[int] = set()  # actors that used up their restarts
        self._restarting: set[int] = set()  # actors Ray is restarting: no work until they are ready again
        self._loads: list[_Call] = []  # adapter loads not yet collected (staleness > 0 does not wait for them)
        self._counts = {"fault/actor_restarts": 0.0, "async/dropped_stale": 0.0}

    @property
    def version(self) -> int:
        """The adapter version last published to the actors."""
        return self._published[-1]

    @version.setter
    def version(self, v: int) -> None:
        self._published.append(v)

    def allowed_versions(self) -> list[int]:
        return self._published[-(self.staleness + 1) :]

    def steps_behind(self, version: int) -> int:
        """How many syncs ago `version` was published (0: the current one)."""
        return len(self._published) - 1 - max(i for i, v in enumerate(self._published) if v == version)

    # ------------------------------------------------------------------------------------------------ generation

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        items: list[dict] | None = None,
    ) -> list[PromptRollout]:
        """Sample on every live actor (prompts sharded) and wait; see submit_generate / collect."""
        return self.collect(self.submit_generate(prompts, sampling, items=items, seeds=seeds))

    def submit_generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        items: list[dict] | None = None,
    ) -> PendingGeneration:
        """Send the prompts out without waiting: the first learner_chunk_size x learners to the learners (learner
        generation, DistRL-LLM), the rest sharded over the live actors. Calls queue behind each member's earlier
        calls, so an adapter load sent before applies to them and one sent after does not. `items` (the prompts'
        env items) go to the actors only with a multi-turn env, whose episodes start from them. `seeds` (one per
        prompt, rl/data/prompts.py prompt_seed) travel with their prompts wherever they go, a re-sent prompt's included,
        so a prompt's samples do not depend on the actor or batch it lands in; None samples unseeded."""
        n_learn = min(self.learner_chunk_size * len(self.learners), len(prompts))
        learner_parts = shard(prompts[:n_learn], len(self.learners)) if n_learn else []
        learner_seeds = _split_like(seeds, learner_parts)
        learner_calls = [
            self.learners.submit(j, "generate", p, sampling, s)
            for j, (p, s) in enumerate(zip(learner_parts, learner_seeds))
            if p
        ]
        self._rejoin(wait=True)
        live = self.live_actors()
        parts = shard(prompts[n_learn:], len(live))
        item_parts: list[list[dict] | None] = (
            shard(items[n_learn:], len(live)) if self.episodes and items is not None else [None] * len(parts)
        )
        seed_parts = _split_like(seeds[n_learn:] if seeds is not None else None, parts)
        calls = [
            self._submit(i, "generate", *_args(p, sampling, it, s))
            for i, p, it, s in zip(live, parts, item_parts, seed_parts)
        ]
        return PendingGeneration(parts, sampling, calls, seed_parts, learner_calls, item_parts)

    def collect(self, pending: PendingGeneration) -> list[PromptRollout]:
        """Wait for a submitted generation: all prompts' rollouts in prompt order, whatever died on the way."""
        out: list[PromptRollout] = []
        for j, handle in enumerate(pending.learner_calls):
            rollouts = self.learners.result(handle)
            for r in rollouts:
                if r.adapter_version not in self.allowed_versions():
                    raise VersionMismatch(
                        f"learner {j} generated with adapter version {r.adapter_version}, expected one of "
                        f"{self.allowed_versions()}: it is not the version the actors were sent"
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
        call: _Call,
        again: bool = False,
        items: list[dict] | None = None,
        seeds: list[int] | None = None,
    ) -> list[PromptRollout]:
        while True:
            try:
                rollouts = self.actors.result(call.handle)
                break
            except MemberDied as e:
                to = self._actor_died(call, "generate", e, len(part))
                call = self._submit(to, "generate", *_args(part, sampling, items, seeds))
        for r in rollouts:
            r.actor = call.actor
        stale = [k for k, r in enumerate(rollouts) if not self._version_ok(call.actor, r.adapter_version)]
        if stale:
            if again:  # the adapter was re-sent before this call: the actor did not take it
                self._raise_mismatch(call.actor, rollouts[stale[0]].adapter_version)
            self._counts["async/dropped_stale"] += sum(len(rollouts[k].completions) for k in stale)
            print(
                f"rollout actor {call.actor} generated {len(stale)} prompt(s) with adapter version "
                f"{rollouts[stale[0]].adapter_version}, older than the staleness bound (allowed "
                f"{self.allowed_versions()}): dropped (async/dropped_stale) and generated again",
                flush=True,
            )
            redo = [part[k] for k in stale]
            redo_items = [items[k] for k in stale] if items is not None else None
            redo_seeds = [seeds[k] for k in stale] if seeds is not None else None
            resent = self._submit(call.actor, "generate", *_args(redo, sampling, redo_items, redo_seeds))
            fresh = self._finish_part(redo, sampling, resent, again=True, items=redo_items, seeds=redo_seeds)
            for k, r in zip(stale, fresh):
                rollouts[k] = r
        return rollouts

    def _version_ok(self, actor: int, version: int) -> bool:
        """True within the bound, False for a published version older than it; raises for any other version."""
        if version in self.allowed_versions():
            return True
        if version in self._published:
            return False
        self._raise_mismatch(actor, version)

    def _raise_mismatch(self, actor: int, version: int) -> None:
        expected = self.version if self.staleness == 0 else f"one of {self.allowed_versions()}"
        raise VersionMismatch(
            f"rollout actor {actor} generated with adapter version {version}, expected {expected}: "
            "the adapter sync did not reach it"
        )

    # ------------------------------------------------------------------------------------------------ faults

    def live_actors(self) -> list[int]:
        """Actors that take new work: not past their restarts and not restarting."""
        return [i for i in range(len(self.actors)) if i not in self._gone and i not in self._restarting]

    def _submit(self, actor: int, method: str, *args: Any) -> _Call:
        return _Call(actor, self._deaths[actor], self.actors.submit(actor, method, *args))

    def _rejoin(self, wait: bool) -> None:
        """Take back restarted actors that are ready again, the current adapter queued before any work (a restart
        ran __init__ again: base model, version 0). With `wait`, wait while no actor at all is live."""
        deadline = time.monotonic() + REJOIN_TIMEOUT_S
        while True:
            for i in sorted(self._restarting):
                if self.actors.ready(i):
                    ref = self._published_ref()
                    if ref is None and self.weight_sync == "ipc" and self.version > 0:
                        continue  # learner 0 is past the published version: the next sync takes this actor back
                    self._restarting.discard(i)
                    if ref is not None:
                        self._loads.append(self._submit(i, "load_adapter", ref))
                    print(f"rollout actor {i} is back after its restart; adapter version {self.version} sent first")
            if self.live_actors() or not wait:
                return
            if not self._restarting:
                raise RuntimeError(
                    "every rollout actor is dead and none has restarts left (cluster.actor_max_restarts): find why "
                    "they die (out of memory? the Ray logs say) or raise cluster.actor_max_restarts"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"no rollout actor came back from its restart within {REJOIN_TIMEOUT_S:.0f} s")
            time.sleep(0.5)

    def _published_ref(self) -> Any:
        """The published adapter for a restarted actor (None: the base model, version 0): what the last sync put in
        the object store; `cluster.weight_sync=ipc` puts nothing there, so learner 0's policy is fetched as bytes
        now, once per sync, if it is still the published version (with staleness > 0 the learner may be a step
        ahead, and a version from the future would fail the run). The version is asked first, so that a learner
        already ahead is not asked for its adapter's bytes; the adapter's own version is checked again, since the
        learner may step in between."""
        if self._adapter_ref is None and self.weight_sync == "ipc" and self.version > 0:
            if self.learners.call("get_version", [()])[0] != self.version:
                return None
            adapter = self.adapter(for_sync=True)
            if adapter.version == self.version:
                self._adapter_ref = self.actors.put(adapter)
        return self._adapter_ref

    def _actor_died(self, call: _Call, method: str, e: MemberDied, n_prompts: int) -> int:
        """Handle a dead rollout actor once per death (calls sent to it before the death fail with it, and calls
        to a restarting actor fail at once: neither is a new death); returns the live actor that takes its work."""
        i = call.actor
        if call.epoch == self._deaths[i]:
            self._deaths[i] += 1
            self._counts["fault/actor_restarts"] += 1
            if self._deaths[i] > self.actor_max_restarts:
                self._gone.add(i)
                what = f"it used up its {self.actor_max_restarts} restart(s) (cluster.actor_max_restarts): left out"
            else:
                self._restarting.add(i)
                what = f"Ray restarts it (restart {self._deaths[i]} of {self.actor_max_restarts})"
        else:
            what = "the same death"
        self._rejoin(wait=True)
        live = self.live_actors()
        others = [j for j in live if j != i]
        to = min(others, key=lambda j: (j - i) % len(self.actors)) if others else live[0]
        if n_prompts:
            what += f"; its {n_prompts} prompt(s) go to actor {to}"
        print(f"rollout actor {i} died during {method} ({e.cause}): {what}", flush=True)
        return to

    def pop_counts(self) -> dict[str, float]:
        """fault/actor_restarts and async/dropped_stale since the last call."""
        out = dict(self._counts)
        self._counts = dict.fromkeys(self._counts, 0.0)
        return out

    def pop_idle(self, elapsed_s: float) -> dict[str, float]:
        """Share of `elapsed_s` each role spent outside calls (from the calls collected meanwhile)."""
        n_act, n_learn = max(len(self.live_actors()), 1), len(self.learners)
        busy_a, busy_l = self.actors.pop_busy_s(), self.learners.pop_busy_s()
        return {
            "perf/actor_idle_frac": min(max(1.0 - busy_a / max(elapsed_s * n_act, 1e-9), 0.0), 1.0),
            "perf/learner_idle_frac": min(max(1.0 - busy_l / max(elapsed_s * n_learn, 1e-9), 0.0), 1.0),
        }

    # ------------------------------------------------------------------------------------------------ learning

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step on every learner, data-parallel: each gets a shard of whole prompt groups, the
        learners sum their globally normalised gradients, and all step identically (`learner/checksum_spread`,
        the max - min of the learners' adapter checksums, is 0 when they agree)."""
        slept = self._rest_actors()
        n = len(self.learners)
        if n == 1:
            return self.learners.call("train_step", [(samples,)])[0] | slept
        results = self.learners.call("train_step", [(part,) for part in shard_groups(samples, n)])
        out = merge_learner_metrics(results) | slept
        checksums = self.learners.broadcast("adapter_checksum")
        out["learner/checksum_spread"] = max(checksums) - min(checksums)
        return out

    def _wake_actors(self) -> dict[str, float]:
        """`cluster.colocate`: the actors take their GPU memory back before the sync loads into their weights."""
        return {"time/actor_wake_s": self._on_live_actors("wake_up")} if self.colocate else {}

    def _rest_actors(self) -> dict[str, float]:
        """`cluster.colocate`: every live actor sleeps (frees its GPU memory) before the learners on its GPU train;
        the next call that runs its engine (the sync's load) wakes it. Nothing is in flight here: staleness is 0."""
        return {"time/actor_sleep_s": self._on_live_actors("sleep")} if self.colocate else {}

    def _on_live_actors(self, method: str) -> float:
        """Call `method` on every live actor and wait (an actor that dies meanwhile is handed to Ray's restart, as
        anywhere else); the seconds it took."""
        t0 = time.perf_counter()
        self._results([self._submit(i, method) for i in self.live_actors()], method)
        return time.perf_counter() - t0

    def _results(self, calls: list[_Call], what: str) -> list[tuple[_Call, Any]]:
        """Each call's result, in order; a call whose actor died is handed to Ray's restart (`_actor_died`, counted)
        and left out: it carried no prompts to send again."""
        out = []
        for call in calls:
            try:
                out.append((call, self.actors.result(call.handle)))
            except MemberDied as e:
                self._actor_died(call, what, e, 0)
        return out

    def reference_logprobs(self, rollouts: list[PromptRollout]) -> list[list[float]]:
        """Per-token logprobs of every completion under the reference policy (learner 0, adapter disabled)."""
        c_ids = [c.token_ids for c in completions_of(rollouts)]
        return self.learners.call("sequence_logprobs", [(prompts_of(rollouts), c_ids, True)])[0]

    def adapter(self, for_sync: bool = False) -> Adapter:
        """Learner 0's current adapter (`for_sync`: in the precision the actors load it at)."""
        return self.learners.call("get_adapter", [(for_sync,)])[0]

    # ------------------------------------------------------------------------------------------------ sync

    def sync(self) -> dict[str, float]:
        """Publish learner 0's adapter to every live rollout actor as a new version. The loads queue behind the
        actors' calls in flight; with staleness > 0 they are not waited for (sync/actor_load_s is then the
        previous sync's)."""
        woke = self._wake_actors()
        if self.weight_sync == "ipc":
            return self._sync_ipc() | woke
        t0 = time.perf_counter()
        adapter = self.adapter(for_sync=True)
        exported_s = time.perf_counter() - t0  # the learner's export and its return to this process
        loaded = self._collect_loads()
        self._adapter_ref = self.actors.put(adapter)
        self.version = adapter.version
        self._loads = [self._submit(i, "load_adapter", self._adapter_ref) for i in self.live_actors()]
        self._rejoin(wait=False)  # a restarted actor that is ready again gets this adapter too
        if self.staleness == 0:
            loaded = self._collect_loads()
        out = {
            "time/sync_s": time.perf_counter() - t0,
            "sync/adapter_mb": adapter.nbytes / 2**20,
            "time/sync_export_s": exported_s,
            "time/sync_learner_export_s": adapter.export_s,
            "sync/version": float(adapter.version),
        }
        if loaded:
            out["sync/actor_load_s"] = max(x["seconds"] for x in loaded)
        return out | woke

    def _sync_ipc(self) -> dict[str, float]:
        """Learner 0's policy (full weights, or the adapter's packed factors) to every live actor through CUDA IPC
        handles, synchronously whatever the staleness: the learner keeps the tensors alive until every actor loaded
        them. An actor that Ray restarted gets the policy as bytes instead (`_published_ref`)."""
        t0 = time.perf_counter()
        self._collect_loads()
        self._adapter_ref = None  # a restarted actor's copy of the previous version
        version = self.learners.call("get_version", [()])[0]
        info = self.learners.call("ipc_weights", [()])[0]
        exported_s = time.perf_counter() - t0
        try:
            calls = [self._submit(i, "load_weights_ipc", info, version) for i in self.live_actors()]
            loads = [self.actors.result(c.handle) for c in calls]
        finally:
            self.learners.call("release_ipc_weights", [()])
        self.version = version
        self._rejoin(wait=False)  # learner 0 is at the published version now: restarted actors can take it
        return {
            "time/sync_s": time.perf_counter() - t0,
            "time/sync_export_s": exported_s,
            "sync/actor_load_s": max(x["seconds"] for x in loads),
            "sync/version": float(version),
        }

    def _collect_loads(self) -> list[dict]:
        out = [result for _, result in self._results(self._loads, "load_adapter")]
        self._loads = []
        return out

    def probe_submit(self, prompts: list[list[int]], sampling: Sampling, seeds: list[int] | None = None) -> list[_Call]:
        """Start the sync probe on every live actor (it queues behind the adapter load of the last sync)."""
        self._rejoin(wait=True)
        return [self._submit(i, "generate", prompts, sampling, seeds) for i in self.live_actors()]

    def probe_finish(self, calls: list[_Call]) -> float:
        """Mean |logp_learner - logp_actor| over the probe's tokens; call it before the learners step again.
        An actor that died meanwhile is left out of this probe (it is restarted and re-sent the adapter)."""
        per_actor = [(call.actor, rollouts) for call, rollouts in self._results(calls, "the sync probe")]
        for i, rollouts in list(per_actor):
            for r in rollouts:
                if r.adapter_version != self.version and not self._version_ok(i, r.adapter_version):
                    # an older published version: an actor restarted just before the probe; it is not compared
                    print(f"sync probe: rollout actor {i} answered with adapter version {r.adapter_version}; skipped")
                    per_actor.remove((i, rollouts))
                    break
                if r.adapter_version != self.version:
                    self._raise_mismatch(i, r.adapter_version)
        diffs: list[float] = []
        for _, rollouts in per_actor:
            completions = completions_of(rollouts)
            c_ids = [c.token_ids for c in completions]
            learner_lp = self.learners.call("sequence_logprobs", [(prompts_of(rollouts), c_ids)])[0]
            actor_lp = [c.logprobs for c in completions]
            for a, b in zip(actor_lp, learner_lp):
                diffs.extend(abs(x - y) for x, y in zip(a, b))
        return sum(diffs) / max(len(diffs), 1)

    def close(self) -> None:
        for group in (self.actors, self.learners):
            try:
                group.close()
            except Exception:  # closing one role must not stop the other from being closed
                pass


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
    out, start = [], 0
    for part in parts:
        out.append(seeds[start : start + len(part)])
        start += len(part)
    return out
