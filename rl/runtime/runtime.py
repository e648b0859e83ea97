"""The roles of a run driven as one: what the driver, the sampler and the evaluation call.

`Runtime` holds the rollout actors (rl/runtime/pool.py: live ones, deaths, restarts) and the learners (in this
process or Ray actors, rl/runtime/groups.py), and puts together the three jobs done on them: generation in flight
under the staleness bound (pipeline.py), adapter sync and its probe (sync.py), and the learners' data-parallel
step (here: shard, step together, check that they agree). Each job's logic is written once, in its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl.config.cluster import ClusterConfig
from rl.runtime.groups import Group, merge_learner_metrics, shard, shard_groups
from rl.runtime.pipeline import PendingGeneration, Pipeline
from rl.runtime.pool import ActorPool, Call
from rl.runtime.roles import Learner, Method, RolloutActor, T, Teacher
from rl.runtime.stream import NewGroup, Stream
from rl.runtime.sync import AdapterSync, ProbeReading, Versions
from rl.types import Adapter, PromptRollout, Sampling, TrainSample, completions_of, prompts_of


@dataclass
class PendingStep:
    """A learners' step sent and not yet collected (`Runtime.submit_train_step`)."""

    handles: list[Any]
    slept: dict[str, float]


class Runtime:
    """Splits work over the roles and keeps the actors' adapter versions honest. `cluster` (the resolved group)
    gives the staleness, restarts, learner chunk, weight sync, colocation and a continuous stream's segments (None:
    the schema's defaults). `teachers`: the judge/teacher engines (cluster.num_teachers; None when there are none),
    restarted as actors are. `episodes`: the actors run multi-turn episodes (the config's `episodes` is set)."""

    def __init__(
        self,
        actors: Group[RolloutActor],
        learners: Group[Learner],
        cluster: ClusterConfig | None = None,
        teachers: Group[Teacher] | None = None,
        *,
        episodes: bool = False,
    ):
        c = self.cluster = cluster or ClusterConfig()
        self.episodes = episodes
        self.actors, self.learners, self.teachers = actors, learners, teachers
        self.teacher_pool = ActorPool(teachers, c.actor_max_restarts, "judge/teacher") if teachers else None
        self.colocate = c.colocate  # actors sleep while the learners train (one GPU per actor/learner pair)
        self.versions = Versions(c.staleness)
        self.pool = ActorPool(actors, c.actor_max_restarts)
        self.adapter_sync = AdapterSync(self.pool, learners, self.versions, c.weight_sync.value)
        self.pipeline = Pipeline(
            self.pool,
            learners,
            self.versions,
            learner_chunk_size=c.learner_chunk_size,
            episodes=episodes,
        )

    @property
    def version(self) -> int:
        """The adapter version last published to the actors."""
        return self.versions.current

    @version.setter
    def version(self, v: int) -> None:
        self.versions.published.append(v)

    def steps_behind(self, version: int) -> int:
        return self.versions.steps_behind(version)

    def live_actors(self) -> list[int]:
        return self.pool.live()

    # ------------------------------------------------------------------------------------------------ generation

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        items: list[dict] | None = None,
    ) -> list[PromptRollout]:
        """Sample on every live actor (prompts sharded) and wait; see submit_generate / collect."""
        return self.collect(self.submit_generate(prompts, sampling, seeds=seeds, items=items))

    def submit_generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        items: list[dict] | None = None,
    ) -> PendingGeneration:
        return self.pipeline.submit_generate(prompts, sampling, seeds=seeds, items=items)

    def collect(self, pending: PendingGeneration) -> list[PromptRollout]:
        return self.pipeline.collect(pending)

    def stream(
        self,
        sampling: Sampling,
        groups_in_flight: int,
        draw: Callable[[], NewGroup | None],
        decode: Callable[[list[list[int]]], list[str]],
    ) -> Stream:
        """Continuous generation on the live actors (cluster.rollout_mode=continuous, rl/runtime/stream.py);
        `groups_in_flight` is the schema's derived value of that name."""
        return Stream(
            self.pool,
            self.versions,
            sampling,
            segment_tokens=self.cluster.segment_tokens,
            groups_in_flight=groups_in_flight,
            bound=self.cluster.staleness,
            episodes=self.episodes,
            draw=draw,
            decode=decode,
        )

    # ------------------------------------------------------------------------------------------------ learning

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step on every learner, data-parallel: each gets a shard of whole prompt groups, the
        learners sum their globally normalised gradients, and all step identically (`learner/checksum_spread`,
        the max - min of the learners' adapter checksums, is 0 when they agree). Colocated actors sleep first
        (they free their GPU memory for the learners; the next sync wakes them): nothing is in flight then."""
        return self.finish_train_step(self.submit_train_step(samples))

    def submit_train_step(self, samples: list[TrainSample]) -> PendingStep:
        """Start `train_step` without waiting (a continuous rollout keeps the actors fed meanwhile)."""
        slept = {"time/actor_sleep_s": self.pool.on_live(RolloutActor.sleep)} if self.colocate else {}
        n = len(self.learners)
        parts = [samples] if n == 1 else shard_groups(samples, n)
        return PendingStep([self.learners.submit(j, Learner.train_step, p) for j, p in enumerate(parts)], slept)

    def train_step_done(self, pending: PendingStep, timeout_s: float = 0.0) -> bool:
        return len(self.learners.wait(pending.handles, timeout_s)) == len(pending.handles)

    def finish_train_step(self, pending: PendingStep) -> dict[str, float]:
        results = [self.learners.result(h) for h in pending.handles]
        if len(results) == 1:
            return results[0] | pending.slept
        out = merge_learner_metrics(results) | pending.slept
        checksums = self.learners.broadcast(Learner.adapter_checksum)
        out["learner/checksum_spread"] = max(checksums) - min(checksums)
        return out

    def reference_logprobs(self, rollouts: list[PromptRollout]) -> list[list[float]]:
        """Per-token logprobs of every completion under the reference policy (learner 0, adapter disabled)."""
        c_ids = [c.token_ids for c in completions_of(rollouts)]
        return self.learners.call(Learner.sequence_logprobs, [(prompts_of(rollouts), c_ids, True)])[0]

    def adapter(self, for_sync: bool = False) -> Adapter:
        return self.adapter_sync.adapter(for_sync)

    # ------------------------------------------------------------------------------------------------ teachers

    def teacher_generate(self, prompts: list[list[int]], sampling: Sampling) -> list[PromptRollout]:
        """Judge verdicts: the prompts sharded over the live judge/teacher engines, results in prompt order."""
        return self._on_teachers(Teacher.generate, len(prompts), lambda idx: ([prompts[k] for k in idx], sampling))

    def teacher_logprobs(self, rollouts: list[PromptRollout]) -> list[list[float]]:
        """The teacher's logprob of every sampled token of every completion (algorithm=distill), in rollout order."""
        prompts, comps = prompts_of(rollouts), [c.token_ids for c in completions_of(rollouts)]
        return self._on_teachers(
            Teacher.token_logprobs, len(comps), lambda idx: ([prompts[k] for k in idx], [comps[k] for k in idx])
        )

    def _on_teachers(
        self, method: Method[Teacher, ..., list[T]], n: int, args_of: Callable[[list[int]], tuple]
    ) -> list[T]:
        """`method` on contiguous shards of n items over the live teachers, results in item order; a teacher that
        dies in the call is handed to Ray's restart and its shard goes to a live one (as an actor's prompts do)."""
        pool = self.teacher_pool
        if pool is None:
            raise RuntimeError("no judge/teacher engine runs: set cluster.num_teachers=1 (teacher.path: its model)")
        if n == 0:
            return []
        pool.rejoin(wait=True)
        live = pool.live()
        parts = shard(list(range(n)), len(live))
        calls = [(idx, pool.submit(i, method, *args_of(idx))) for i, idx in zip(live, parts) if idx]
        out: list[T] = []
        for idx, call in calls:
            out.extend(pool.result_or_resend(call, method, args_of(idx), len(idx))[1])
        return out

    # ------------------------------------------------------------------------------------------------ sync

    def sync(self) -> dict[str, float]:
        """Publish learner 0's adapter to the live actors as a new version (colocated actors wake for it first)."""
        woke = {"time/actor_wake_s": self.pool.on_live(RolloutActor.wake_up)} if self.colocate else {}
        return self.adapter_sync.sync() | woke

    def probe_submit(self, prompts: list[list[int]], sampling: Sampling, seeds: list[int] | None = None) -> list[Call]:
        return self.adapter_sync.probe_submit(prompts, sampling, seeds)

    def probe_finish(self, calls: list[Call]) -> ProbeReading:
        return self.adapter_sync.probe_finish(calls)

    # ------------------------------------------------------------------------------------------------ metrics

    def pop_counts(self) -> dict[str, float]:
        """fault/actor_restarts and async/dropped_stale since the last call."""
        out = {
            "fault/actor_restarts": float(self.pool.restarts),
            "async/dropped_stale": float(self.pipeline.dropped_stale),
        }
        self.pool.restarts, self.pipeline.dropped_stale = 0, 0
        if self.teacher_pool is not None:
            out["fault/teacher_restarts"] = float(self.teacher_pool.restarts)
            self.teacher_pool.restarts = 0
        return out

    def pop_idle(self, elapsed_s: float) -> dict[str, float]:
        """Share of `elapsed_s` each role spent outside calls (from the calls collected meanwhile)."""
        n_act, n_learn = max(len(self.pool.live()), 1), len(self.learners)
        busy_a, busy_l = self.actors.pop_busy_s(), self.learners.pop_busy_s()
        return {
            "perf/actor_idle_frac": min(max(1.0 - busy_a / max(elapsed_s * n_act, 1e-9), 0.0), 1.0),
            "perf/learner_idle_frac": min(max(1.0 - busy_l / max(elapsed_s * n_learn, 1e-9), 0.0), 1.0),
        }

    def close(self) -> None:
        for group in (self.actors, self.learners, *([self.teachers] if self.teachers else [])):
            try:
                group.close()
            except Exception:  # closing one role must not stop the other from being closed
                pass
