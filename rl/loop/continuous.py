"""One step's scored batch under `cluster.rollout_mode=continuous`: the prompt groups that finished first, from a
generation that never stops (rl/runtime/stream.py).

The same contract as rl/loop/sampler.py's `Sampler` (the driver cannot tell them apart): `next(step)` returns a
scored, filtered batch of `run.prompts_per_step` groups, `state_dict`/`load_state` the data position. What differs:
- prompts are drawn one at a time, when the stream has room, in data order (with a curriculum: its choice), and
  each prompt's seed is its draw number's (rl/seeds.py), as in batch mode;
- groups arrive in the order they finish, so they are trained out of draw order. A checkpoint saves the data
  position before the oldest prompt not yet trained, with the draw numbers after it that were (`skip`): a resumed
  run draws from there again and passes over those, so no prompt is trained twice or skipped. Samples in flight at
  a checkpoint are not saved: a resumed run generates their prompts again from the start, with its adapter;
- dynamic sampling (`algorithm.dynamic_sampling`) drops a filtered group and takes the next one to finish, up to
  `dynamic_sampling_max_rounds` batches' worth of groups per step;
- a group dropped for staleness (the per-sample bound, `cluster.staleness`) is counted and its prompt is not
  trained (it counts as consumed, like a filtered group).
"""

from __future__ import annotations

import time
from typing import Any

from rewards.protocol import RewardFn
from rl.config.run import RunConfig
from rl.config.schema import AlgorithmConfig
from rl.data.curriculum import Curriculum, Sequential, pass_rates
from rl.data.prompts import PromptData
from rl.loop.sampler import (
    Batch,
    assemble_batch,
    choice_point,
    kept_groups,
    max_rounds,
    restore_position,
    saved_position,
    score,
)
from rl.runtime.runtime import Runtime
from rl.runtime.stream import NewGroup, StreamGroup
from rl.seeds import prompt_seed
from rl.types import PromptRollout, Sampling, completions_of


class ContinuousSampler:
    """Reads run.prompts_per_step and run.seed (`run`), group_size and the dynamic-sampling keys of `algorithm`;
    `sampling`: the schema's sampling_for("train"); `staleness`: cluster.staleness; `groups_in_flight`: the schema's
    derived value (the runtime's stream reads cluster.segment_tokens); `correct_threshold`: eval.correct_threshold;
    `steps` is the last step it will be asked for."""

    overlapped = True  # the actors generate while the learners train

    def __init__(
        self,
        runtime: Runtime,
        data: PromptData,
        reward_fn: RewardFn,
        run: RunConfig,
        algorithm: AlgorithmConfig,
        *,
        sampling: Sampling,
        steps: int,
        tokenizer: Any,
        groups_in_flight: int,
        staleness: int = 0,
        correct_threshold: float = 1.0,
        curriculum: Curriculum | None = None,
    ):
        self.runtime, self.reward_fn, self.steps = runtime, reward_fn, steps
        self.run, self.algorithm = run, algorithm
        self.staleness, self.correct_threshold = staleness, correct_threshold
        self.curriculum = curriculum or Sequential()
        self.data = self.curriculum.next_data(data)
        self.open: dict[int, dict] = {}  # draw number -> the data state before it, for prompts drawn, not consumed
        self.consumed: set[int] = set()  # draw numbers trained or dropped after the oldest open one
        self.skip: set[int] = set()  # after a resume: draw numbers the checkpointed run had already consumed
        self.step = 1  # the step being filled (what is left to draw for)
        self.kept = 0  # groups handed to the learners by this sampler
        self.syncs_before: int | None = None  # adapter versions published before this sampler's first draw

        def decode(ids: list[list[int]]) -> list[str]:
            return tokenizer.batch_decode(ids, skip_special_tokens=True)

        self.stream = runtime.stream(sampling, groups_in_flight, self._draw, decode)

    @property
    def cursor(self) -> int:
        return self.data.cursor

    def pump(self) -> None:
        """Keep the actors fed while the driver waits for something else (the learners' step): fold in what has
        finished and send what waits, without blocking (the caller's wait is the pause between calls)."""
        self.stream.pump(0.0)

    def _draw(self) -> NewGroup | None:
        """The next prompt for the stream; None while a group started now could not be trained within the bound, or
        once the groups in flight fill the remaining steps (filtered and stale groups are drawn again).

        The bound, AReaL's: with k = cluster.staleness and v syncs so far, at most (v + k + 1) batches' worth of
        groups are started in all, so that the groups started under the current adapter are trained by the k-th
        sync after it. Without it a fast actor would fill the room with groups the learner reaches too late (they
        would be generated only to be dropped)."""
        n, published = self.run.prompts_per_step, len(self.runtime.versions.published)
        if self.syncs_before is None:
            self.syncs_before = published
        syncs = published - self.syncs_before
        if self.kept + len(self.open) >= (syncs + self.staleness + 1) * n:
            return None
        if len(self.open) >= (self.steps - self.step + 1) * n:
            return None
        while True:
            self.data = self.curriculum.next_data(self.data)
            before = choice_point(self.data, self.curriculum)
            key = self.data.cursor
            (i,) = self.curriculum.choose(self.data, 1)
            if key in self.skip:
                self.skip.discard(key)
                continue
            self.open[key] = before
            return NewGroup(self.data.prompt_ids[i], self.data.items[i], prompt_seed(self.run.seed, key),
                            (key, self.data, i))  # fmt: skip

    def _consume(self, g: StreamGroup) -> None:
        key = g.new.tag[0]
        self.open.pop(key, None)
        self.consumed.add(key)
        oldest = min(self.open, default=None)
        self.consumed = {k for k in self.consumed if oldest is not None and k > oldest}

    def next(self, step: int) -> Batch:
        """The first `run.prompts_per_step` groups to finish (and pass dynamic sampling's filter), scored."""
        a, n, threshold = self.algorithm, self.run.prompts_per_step, self.correct_threshold
        G, self.step = a.group_size, step
        limit = n * max_rounds(a)
        kept: list[PromptRollout] = []
        kept_rewards: list[float] = []
        last: tuple[list[PromptRollout], list[float]] = ([], [])
        generated = gen_tokens = 0
        t_rollout = t_reward = 0.0
        while len(kept) < n and generated < limit:
            t0 = time.perf_counter()
            groups = self.stream.take(min(n - len(kept), limit - generated))
            t_rollout += time.perf_counter() - t0
            for g in self.stream.pop_dropped():
                self._consume(g)
            if not groups:
                break
            rollouts = [self.stream.rollout(g) for g in groups]
            t0 = time.perf_counter()
            rewards = score(self.reward_fn, rollouts, [g.new.item for g in groups])
            t_reward += time.perf_counter() - t0
            generated += len(groups)
            gen_tokens += sum(c.model_tokens for c in completions_of(rollouts))
            keep = kept_groups(rewards, G, a)
            for j, (g, r) in enumerate(zip(groups, rollouts)):
                group_rewards = rewards[j * G : (j + 1) * G]
                _, data, i = g.new.tag
                self.curriculum.observe(data, [i], pass_rates(group_rewards, G, threshold))
                self._consume(g)
                if keep[j]:
                    kept.append(r)
                    kept_rewards.extend(group_rewards)
            last = (rollouts, rewards)
        batch = assemble_batch(
            kept,
            kept_rewards,
            last,
            n=n,
            group_size=G,
            generated=generated,
            gen_tokens=gen_tokens,
            t_rollout=t_rollout,
            t_reward=t_reward,
            data=self.data,
            curriculum=self.curriculum,
            reward_fn=self.reward_fn,
        )
        self.step, self.kept = step + 1, self.kept + len(batch.rollouts)
        batch.stats |= self.version_metrics(batch.rollouts) | self.stream.pop_counts()
        return batch

    def version_metrics(self, rollouts: list) -> dict[str, float]:
        """The batch's samples by the lag of their oldest token (a histogram, async/lag_<syncs>) and how many span
        more than one adapter version (partial rollouts continued across an update)."""
        versions = [c.versions or [r.adapter_version] for r in rollouts for c in r.completions]
        lags = [self.runtime.steps_behind(min(v)) for v in versions]
        out = {f"async/lag_{k}": float(lags.count(k)) for k in range(self.staleness + 1)}
        out["async/partial_rollouts"] = float(sum(len(set(v)) > 1 for v in versions))
        return out

    def state_dict(self) -> dict:
        """The data position before the oldest prompt not yet trained, and the draw numbers after it that were."""
        # `consumed` holds only draw numbers after the oldest open one (`_consume` prunes it); `skip`, those a resume
        # still has to pass over, lie beyond every draw so far
        before = self.open[min(self.open)] if self.open else choice_point(self.data, self.curriculum)
        return saved_position(before, self.curriculum) | {"skip": sorted(self.consumed | self.skip)}

    def load_state(self, state: dict) -> None:
        self.data = restore_position(state, self.data, self.curriculum)
        self.skip = set(state.get("skip", []))
