"""Curricula: which prompts the sampler sends next (`curriculum=none|pass_rate|difficulty`).

The sampler (rl/loop/sampler.py) stays the one owner of the data, its cursor and the queue of batches in flight; a
curriculum is asked for the next batch's prompts (`choose`) and told every generated group's pass rate
(`observe`: the fraction of its G samples whose reward >= eval.correct_threshold, every round of dynamic sampling
included, before any filter). Each reads its `curriculum.*` keys from the `curriculum` group (and run.seed).
Three kinds:

- `Sequential` (none): the data's seeded order, as without a curriculum.
- `PassRateCurriculum` (pass_rate): per training prompt, an exponential moving average of its pass rate over its
  visits (`curriculum.ema` is the old estimate's weight). A prompt whose estimate is >= `solved` or <= `hopeless` is skipped
  before generating (no tokens spent on a group whose advantages would all be zero) and the next one in data order
  is taken instead; with probability `revisit_prob` it is sent anyway, so a skipped prompt comes back now and then
  and its estimate is refreshed (the policy moves: a solved prompt can be forgotten, a hopeless one learned).
  Prompts never visited are always sent. A batch never skips more than the data holds (every prompt would be
  skipped: the rest are sent as drawn). Skipping matters when prompts repeat (a training set smaller than
  run.steps x run.prompts_per_step); on a first pass over the data nothing has a rate yet.
- `DifficultyCurriculum` (difficulty): a reasoning-gym task's difficulty, stepped with reasoning-gym's own
  curriculum for the task (envs/reasoning_gym.py TaskCurriculum). When the mean pass rate of the last `window`
  prompt groups generated at the current level reaches `raise_at`, the next batch is drawn from a fresh set of
  training prompts one level up (the held-out set stays the env's, at the level it was built with).

State for checkpoints: the chooser's part (revisit generator, level) is snapshotted before each batch is sent, so
a checkpoint with batches in flight (staleness > 0) saves the choice point before the oldest of them, as the data
position is saved (rl/loop/sampler.py); the statistics (pass rates, window) are saved as they are at the checkpoint. At
staleness 0 nothing is in flight and a resume chooses exactly as the uninterrupted run; with batches in flight the
resumed run re-chooses them with the newer statistics (the same data position, possibly other skips).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from rl.config.choices import CurriculumKind
from rl.config.errors import ConfigError
from rl.config.schema import CurriculumConfig
from rl.data.prompts import PromptData

# pass-rate histogram buckets of the metrics: exactly 0, (0, 0.5), [0.5, 1), exactly 1
BUCKETS = ("0", "lt_half", "ge_half", "1")


class Curriculum(Protocol):
    def next_data(self, data: PromptData) -> PromptData:
        """The prompts to draw the next batch from: `data`, or a new set (a raised difficulty level)."""

    def choose(self, data: PromptData, n: int) -> list[int]:
        """Indices into data.items of the next batch's n prompts (advances data's cursor)."""

    def observe(self, data: PromptData, idx: Sequence[int], pass_rates: Sequence[float]) -> None:
        """Each generated group's pass rate, with the data and indices it was chosen from."""

    def chooser_state(self) -> dict: ...

    def state_dict(self, chooser: dict) -> dict: ...

    def load_state(self, state: dict, data: PromptData) -> PromptData:
        """Restore; returns the data to continue from (a difficulty level's prompts), its position not yet set."""

    def pop_metrics(self) -> dict[str, float]: ...


def pass_rates(rewards: Sequence[float], group_size: int, threshold: float) -> list[float]:
    """Per prompt group: the fraction of its samples whose reward >= threshold (rewards in rollout order)."""
    ok = np.asarray(rewards, dtype=float).reshape(-1, group_size) >= threshold
    return ok.mean(axis=1).tolist()


def histogram(rates: Sequence[float]) -> dict[str, float]:
    """Fractions of `rates` in the BUCKETS, as curriculum/pass_rate_<bucket> metrics."""
    r = np.asarray(rates, dtype=float)
    if r.size == 0:
        return {}
    parts = (r == 0, (r > 0) & (r < 0.5), (r >= 0.5) & (r < 1), r == 1)
    return {f"curriculum/pass_rate_{b}": float(p.mean()) for b, p in zip(BUCKETS, parts)}


class Sequential:
    """No curriculum: the data's order."""

    def next_data(self, data: PromptData) -> PromptData:
        return data

    def choose(self, data: PromptData, n: int) -> list[int]:
        return data.next_batch(n)

    def observe(self, data: PromptData, idx: Sequence[int], pass_rates: Sequence[float]) -> None:
        pass

    def chooser_state(self) -> dict:
        return {}

    def state_dict(self, chooser: dict) -> dict:
        return {}

    def load_state(self, state: dict, data: PromptData) -> PromptData:
        if state:  # a curriculum's checkpoint: its data position belongs to that curriculum's choices
            check_kind(state, "none")
        return data

    def pop_metrics(self) -> dict[str, float]:
        return {}


class PassRateCurriculum:
    """Skips solved and hopeless prompts before generating (see the module docstring)."""

    def __init__(self, cc: CurriculumConfig, *, seed: int):
        self.cc = cc
        self.rates: dict[int, float] = {}  # data index -> EMA of its pass rate
        self._rng = random.Random(seed)
        self._skipped = 0  # since the last pop_metrics
        self._skipped_total = 0

    def next_data(self, data: PromptData) -> PromptData:
        return data

    def due_to_skip(self, i: int) -> bool:
        rate = self.rates.get(i)
        return rate is not None and (rate >= self.cc.solved or rate <= self.cc.hopeless)

    def choose(self, data: PromptData, n: int) -> list[int]:
        chosen: list[int] = []
        skips_left = len(data)  # never more than a pass over the data per batch
        while len(chosen) < n:
            i = data.next_batch(1)[0]
            if skips_left and self.due_to_skip(i) and self._rng.random() >= self.cc.revisit_prob:
                skips_left -= 1
                self._skipped += 1
                continue
            chosen.append(i)
        return chosen

    def observe(self, data: PromptData, idx: Sequence[int], pass_rates: Sequence[float]) -> None:
        a = self.cc.ema
        for i, rate in zip(idx, pass_rates):
            old = self.rates.get(i)
            self.rates[i] = rate if old is None else a * old + (1 - a) * rate

    def chooser_state(self) -> dict:
        return {"rng": self._rng.getstate()}

    def state_dict(self, chooser: dict) -> dict:
        return {**chooser, "kind": "pass_rate", "rates": dict(self.rates), "skipped_total": self._skipped_total}

    def load_state(self, state: dict, data: PromptData) -> PromptData:
        check_kind(state, "pass_rate")
        self._rng.setstate(state["rng"])
        self.rates = {int(k): float(v) for k, v in state["rates"].items()}
        self._skipped_total = state["skipped_total"]
        return data

    def pop_metrics(self) -> dict[str, float]:
        self._skipped_total += self._skipped
        out = {
            "curriculum/skipped": float(self._skipped),
            "curriculum/skipped_total": float(self._skipped_total),
            "curriculum/tracked": float(len(self.rates)),
        }
        self._skipped = 0
        return out | histogram(list(self.rates.values()))


class DifficultyCurriculum:
    """Raises a reasoning-gym task's level when its recent accuracy reaches raise_at (see the module docstring).

    task: envs.reasoning_gym.TaskCurriculum (name, level, max_level, set_level(), train_items()).
    make_data: turns items into PromptData (tokenised as the run's other prompts)."""

    def __init__(self, cc: CurriculumConfig, task: Any, make_data: Callable[[list[dict]], PromptData]):
        self.cc, self.task, self.make_data = cc, task, make_data
        top = cc.max_level
        self.max_level = task.max_level if top is None else min(top, task.max_level)
        self.level = task.level  # the level of the data batches are drawn from
        self.target = self.level  # the level the next batch is drawn at (> level: a raise is due)
        self.window: deque[float] = deque(maxlen=cc.window)
        self._data: PromptData | None = None  # the current level's prompts (None: not built yet)
        self._raises = 0  # since the last pop_metrics

    def next_data(self, data: PromptData) -> PromptData:
        if self._data is None or self.target != self.level:
            self.task.set_level(self.target)
            self.level = self.target
            self._data = self.make_data(self.task.train_items())
            if len(self._data) == 0:
                raise ConfigError(
                    f"curriculum=difficulty: level {self.level} of env.task={self.task.name!r} left no training "
                    "prompts (all longer than model.max_prompt_tokens): raise it or set curriculum.max_level"
                )
        return self._data

    def choose(self, data: PromptData, n: int) -> list[int]:
        return data.next_batch(n)

    def observe(self, data: PromptData, idx: Sequence[int], pass_rates: Sequence[float]) -> None:
        if data is not self._data or self.target != self.level:  # drawn at an older level, or a raise is due
            return
        self.window.extend(pass_rates)
        full = len(self.window) == self.window.maxlen
        if full and np.mean(self.window) >= self.cc.raise_at and self.level < self.max_level:
            self.target = self.level + 1
            self.window.clear()
            self._raises += 1

    def chooser_state(self) -> dict:
        return {"level": self.level}

    def state_dict(self, chooser: dict) -> dict:
        return {**chooser, "kind": "difficulty", "target": self.target, "window": list(self.window)}

    def load_state(self, state: dict, data: PromptData) -> PromptData:
        check_kind(state, "difficulty")
        self.target = state["level"]
        self._data = None
        data = self.next_data(data)  # the saved level's prompts; their position is the sampler's to load
        self.target = max(state["target"], self.level)
        self.window.clear()
        self.window.extend(state["window"])
        return data

    def pop_metrics(self) -> dict[str, float]:
        out = {"curriculum/level": float(self.level), "curriculum/raises": float(self._raises)}
        if self.window:
            out["curriculum/window_accuracy"] = float(np.mean(self.window))
        self._raises = 0
        return out | histogram(list(self.window))


def check_kind(state: dict, kind: str) -> None:
    if state.get("kind") != kind:
        raise ConfigError(
            f"the checkpoint was taken with curriculum={state.get('kind') or 'none'}, this run has curriculum={kind}: "
            "resume with the same curriculum"
        )


def build_curriculum(
    cc: CurriculumConfig, env: Any, make_data: Callable[[list[dict]], PromptData], *, seed: int
) -> Curriculum:
    """The curriculum `curriculum.kind` names; difficulty needs an env with a reasoning-gym task curriculum."""
    kind = cc.kind
    if kind == CurriculumKind.pass_rate:
        return PassRateCurriculum(cc, seed=seed)
    if kind == CurriculumKind.difficulty:
        if not hasattr(env, "task_curriculum"):
            raise ConfigError(
                f"curriculum=difficulty needs a reasoning-gym env (env._target_=envs.reasoning_gym.ReasoningGymEnv, "
                f"e.g. env=chain_sum); {type(env).__name__} has no difficulty levels: use curriculum=pass_rate"
            )
        return DifficultyCurriculum(cc, env.task_curriculum(), make_data)
    return Sequential()
