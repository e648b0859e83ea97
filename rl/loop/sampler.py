"""One step's scored batch: prompts drawn in order, generations sent ahead (bounded staleness), dynamic sampling.

The sampler is the one owner of the data cursor and of the queue depth (`cluster.staleness`, the steps sent
ahead; the one-step overlap of AReaL/PipelineRL in its simplest form). With staleness k the prompts of step t
are sent to the actors when step t-k starts, so while the learners train on step t the actors already generate
steps t+1..t+k with the adapter of an earlier step (at most k syncs old; rl/runtime/sync.py enforces the bound and
the loss's importance ratio uses the behaviour logprobs the actors return). Nothing here waits early: each actor runs
its calls in order, so an adapter load sent after a generation applies to the generations sent after it.
k = 0 is the synchronous loop (one batch in flight, sent at the start of its own step).

Dynamic sampling (DAPO eq. 11, `algorithm.dynamic_sampling`): groups whose accuracy lies outside
`algorithm.filter_range` are dropped and another round is taken, at most `algorithm.dynamic_sampling_max_rounds` per
step. An extra round takes the next batch of the queue (already in flight, drawn in data order) and the queue is
refilled behind it, so prompts are always consumed in the order they were drawn. A checkpoint saves the data
position before the oldest batch still in flight: a resumed run generates those prompts again (with the checkpoint's
adapter) and never skips or repeats a trained prompt.

Which prompts a batch holds is the curriculum's choice (rl/data/curriculum.py; `curriculum=none` is the data order):
the sampler asks it for the next batch when it sends one, and tells it every generated group's pass rate when it
collects one, every dynamic-sampling round included. A curriculum may also hand over a new set of prompts (a
raised difficulty level): batches in flight keep the prompts they were drawn from.

Each prompt's request carries a seed derived from the run seed and the prompt's draw number in the data stream
(`rl.seeds.prompt_seed`), so its samples are the same whichever actor, batch or round it lands in, and a resumed
run (which draws from the saved data position again) sends the same seeds as an uninterrupted one.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from rewards.protocol import RewardFn, pop_metrics
from rl.config.run import RunConfig
from rl.config.schema import AlgorithmConfig
from rl.data import filters
from rl.data.curriculum import Curriculum, Sequential, pass_rates
from rl.data.prompts import PromptData
from rl.runtime.pipeline import PendingGeneration
from rl.runtime.runtime import Runtime
from rl.seeds import prompt_seed
from rl.types import PromptRollout, Sampling, completions_of


def score(reward_fn: RewardFn, rollouts: list[PromptRollout], items: list[dict]) -> list[float]:
    """One reward per completion, in rollout order (prompt by prompt, G completions each). An episode's reward is
    its last model turn's (outcome) plus the env's per-episode terms (envs/protocol.py)."""
    texts, answers, metas, terms = [], [], [], []
    for r, it in zip(rollouts, items):
        for c in r.completions:
            texts.append(c.text)
            answers.append(it["answer"])
            metas.append(it.get("metadata", {}))
            terms.append(sum(c.episode.terms.values()) if c.episode else 0.0)
    return [float(x) + t for x, t in zip(reward_fn(texts, answer=answers, metadata=metas), terms)]


@dataclass
class Batch:
    rollouts: list[PromptRollout]  # prompt groups that reach the learner, in order
    rewards: list[float]  # task rewards [B*G]
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class _Sent:
    """A batch in flight: the state before it was chosen (what a checkpoint saves), its prompts and where from."""

    before: dict
    data: PromptData
    idx: list[int]
    generation: PendingGeneration


def kept_groups(rewards: list[float], group_size: int, a: AlgorithmConfig) -> torch.Tensor:
    """Which groups dynamic sampling keeps (DAPO eq. 11: accuracy inside `algorithm.filter_range`); all when it
    is off."""
    if not a.dynamic_sampling:
        return torch.ones(len(rewards) // group_size, dtype=torch.bool)
    return filters.keep_groups_in_range(torch.tensor(rewards), group_size, a.filter_range[0], a.filter_range[1])


def max_rounds(a: AlgorithmConfig) -> int:
    """Batches' worth of groups generated per step at most: without dynamic sampling every group is kept, so one
    fills the batch."""
    return a.dynamic_sampling_max_rounds if a.dynamic_sampling else 1


def choice_point(data: PromptData, curriculum: Curriculum) -> dict:
    """The data position and the curriculum's choice state before a draw: what a checkpoint saves to redraw it."""
    return {"data": data.state_dict(), "chooser": curriculum.chooser_state()}


def saved_position(before: dict, curriculum: Curriculum) -> dict:
    """A checkpoint's data state from a choice point, with the curriculum's (its choice point then, its statistics
    now: rl/data/curriculum.py)."""
    state = curriculum.state_dict(before["chooser"])
    return before["data"] | ({"curriculum": state} if state else {})


def restore_position(state: dict, data: PromptData, curriculum: Curriculum) -> PromptData:
    """The data (a curriculum may hand over another set) at a checkpoint's position."""
    data = curriculum.load_state(state.get("curriculum", {}), data)
    data.load_state(state)
    return data


def assemble_batch(
    kept: list[PromptRollout],
    kept_rewards: list[float],
    last: tuple[list[PromptRollout], list[float]],
    *,
    n: int,
    group_size: int,
    generated: int,
    gen_tokens: int,
    t_rollout: float,
    t_reward: float,
    data: PromptData,
    curriculum: Curriculum,
    reward_fn: RewardFn,
) -> Batch:
    """A step's batch: the first `n` (run.prompts_per_step) groups dynamic sampling kept, or, when it kept none, the
    last round's groups (`last`: rollouts and rewards) as they came; and its data metrics: the share of generated
    groups kept, the groups trained of `generated`, their tokens, the waits, the data cursor, and the curriculum's
    and the reward's own counters (reward/errors and reward/timeouts: rewards/runner.py)."""
    G = group_size
    utilization = filters.sample_utilization(min(len(kept), n), generated)
    if not kept:
        kept, kept_rewards = last
    stats = {
        "data/sample_utilization": utilization,
        "data/kept_groups": float(min(len(kept), n)),
        "time/rollout_s": t_rollout,
        "time/reward_s": t_reward,
        "data/cursor": float(data.cursor),
        "data/generated_tokens": float(gen_tokens),
        "data/generated_groups": float(generated),
    }
    stats |= curriculum.pop_metrics() | pop_metrics(reward_fn)
    return Batch(kept[:n], kept_rewards[: n * G], stats)


class Sampler:
    """Reads run.prompts_per_step and run.seed (`run`), group_size and the dynamic-sampling keys of `algorithm`;
    `sampling`: a step's (the schema's sampling_for("train")); `staleness`: cluster.staleness; `correct_threshold`:
    eval.correct_threshold (the curriculum's pass rate); `steps` is the last step it will be asked for (the queue is
    never filled past it)."""

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
        staleness: int = 0,
        correct_threshold: float = 1.0,
        curriculum: Curriculum | None = None,
    ):
        self.runtime, self.reward_fn, self.steps = runtime, reward_fn, steps
        self.run, self.algorithm, self.sampling = run, algorithm, sampling
        self.staleness, self.correct_threshold = staleness, correct_threshold
        self.curriculum = curriculum or Sequential()
        self.data = self.curriculum.next_data(data)
        self._pending: deque[_Sent] = deque()

    @property
    def overlapped(self) -> bool:
        """Whether generation runs ahead of learning (staleness > 0): the actors are busy between steps."""
        return self.staleness > 0

    def _send(self) -> None:
        self.data = self.curriculum.next_data(self.data)
        before = choice_point(self.data, self.curriculum)
        first = self.data.cursor  # the draw number of the batch's first prompt (a curriculum may skip some after it)
        idx = self.curriculum.choose(self.data, self.run.prompts_per_step)
        seeds = [prompt_seed(self.run.seed, first + k) for k in range(len(idx))]
        sent = self.runtime.submit_generate(
            [self.data.prompt_ids[i] for i in idx],
            self.sampling,
            items=[self.data.items[i] for i in idx],
            seeds=seeds,
        )
        self._pending.append(_Sent(before, self.data, idx, sent))

    def _fill(self, step: int) -> None:
        """Batches in flight: staleness + 1 from `step` on, never more than the steps left need."""
        while len(self._pending) < min(self.staleness + 1, self.steps - step + 1):
            self._send()

    def next(self, step: int) -> Batch:
        """Generate (or collect what was sent ahead), score and filter until `run.prompts_per_step` groups are kept
        or the rounds run out; then train on the groups there are (on the last round's if none was kept)."""
        n, G, threshold = self.run.prompts_per_step, self.algorithm.group_size, self.correct_threshold
        kept: list[PromptRollout] = []
        kept_rewards: list[float] = []
        generated = gen_tokens = 0
        t_rollout = t_reward = 0.0
        self._fill(step)
        for _ in range(max_rounds(self.algorithm)):
            t0 = time.perf_counter()
            if not self._pending:
                self._send()
            sent = self._pending.popleft()
            rollouts = self.runtime.collect(sent.generation)
            t_rollout += time.perf_counter() - t0
            t0 = time.perf_counter()
            rewards = score(self.reward_fn, rollouts, [sent.data.items[i] for i in sent.idx])
            t_reward += time.perf_counter() - t0
            self.curriculum.observe(sent.data, sent.idx, pass_rates(rewards, G, threshold))
            generated += len(rollouts)
            gen_tokens += sum(c.model_tokens for c in completions_of(rollouts))
            keep = kept_groups(rewards, G, self.algorithm)
            for g, r in enumerate(rollouts):
                if keep[g]:
                    kept.append(r)
                    kept_rewards.extend(rewards[g * G : (g + 1) * G])
            if len(kept) >= n:
                break
        batch = assemble_batch(
            kept,
            kept_rewards,
            (rollouts, rewards),
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
        if not self.overlapped:  # sent ahead, a batch was generated while the learners worked: its wait is no rate
            batch.stats["perf/rollout_tokens_per_s"] = gen_tokens / max(t_rollout, 1e-9)
        return batch

    def pump(self) -> None:
        """Nothing to do while the learners step: the batches in flight were sent whole."""

    def state_dict(self) -> dict:
        """The data position a checkpoint saves: before the oldest batch still in flight (see the module doc), with
        the curriculum's state (its choice point then, its statistics now: rl/data/curriculum.py)."""
        before = self._pending[0].before if self._pending else choice_point(self.data, self.curriculum)
        return saved_position(before, self.curriculum)

    def load_state(self, state: dict) -> None:
        self.data = restore_position(state, self.data, self.curriculum)

    @property
    def cursor(self) -> int:
        return self.data.cursor
