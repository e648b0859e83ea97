"""reasoning-gym procedural tasks as prompt sources (offline, deterministic by seed), and their difficulty levels
(reasoning-gym's own curriculum for a task) for `curriculum=difficulty` (rl/data/curriculum.py)."""

from __future__ import annotations

from typing import Any

DEFAULT_INSTRUCTION = "Give the final answer as a number at the end."


class ReasoningGymEnv:
    """Train and held-out eval items from a reasoning-gym task.

    task: a registered reasoning-gym dataset name (e.g. chain_sum, basic_arithmetic).
    size: training items (the data order repeats after `size` prompts); seed: training generator seed.
    eval_seed: the held-out set's generator seed; training items whose question is in the held-out set are
    removed, so the held-out accuracy is measured on questions never trained on.
    config: task-specific keyword arguments (difficulty), passed to `reasoning_gym.create_dataset`.
    instruction: appended to each question; system_prompt: optional system message.
    """

    def __init__(
        self,
        task: str = "chain_sum",
        size: int = 2000,
        seed: int = 0,
        eval_size: int = 64,
        eval_seed: int = 1_000_003,
        config: dict[str, Any] | None = None,
        instruction: str = DEFAULT_INSTRUCTION,
        system_prompt: str | None = None,
    ):
        import reasoning_gym

        if not size >= 1 or not eval_size >= 0:
            raise ValueError(f"env.size must be >= 1 and env.eval_size >= 0 (got {size} and {eval_size})")
        self.task, self.size, self.seed = task, size, seed
        self.instruction = instruction
        self.system_prompt = system_prompt
        cfg = self.config = dict(config or {})
        try:
            pool = reasoning_gym.create_dataset(task, size=max(4 * eval_size, 64), seed=eval_seed, **cfg)
            train = reasoning_gym.create_dataset(task, size=size, seed=seed, **cfg)
        except (ValueError, TypeError, AssertionError) as e:
            raise ValueError(f"env.task={task!r} / env.config={cfg}: {e}") from None
        # held out: the first eval_size distinct questions of the eval generator; training never sees them
        self._eval, held_out = [], set()
        self.held_out = held_out
        for e in pool:
            if len(self._eval) < eval_size and e["question"] not in held_out:
                held_out.add(e["question"])
                self._eval.append(self._item(e))
        self._train = [self._item(e) for e in train if e["question"] not in held_out]
        if not self._train:
            raise ValueError(
                f"env.task={task!r}: every training question is in the held-out set; lower eval_size or widen env.config"
            )

    def _item(self, entry: dict[str, Any]) -> dict[str, Any]:
        content = f"{entry['question']} {self.instruction}".strip() if self.instruction else entry["question"]
        messages = [{"role": "user", "content": content}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        metadata = dict(entry.get("metadata", {}))
        metadata["task"] = self.task
        # the reward blanks copies of the question out of a completion (a question may contain its answer)
        metadata["question"] = entry["question"]
        return {
            "messages": messages,
            "answer": str(entry["answer"]),
            "metadata": metadata,
            "question": entry["question"],
        }

    def train_items(self) -> list[dict[str, Any]]:
        return self._train

    def eval_items(self) -> list[dict[str, Any]]:
        return self._eval

    def answer_text(self, item: dict[str, Any]) -> str:
        """A right answer as a model would write it (demonstrations: python -m rl.tools.demos)."""
        return f"The answer is {item['answer']}."

    def task_curriculum(self) -> TaskCurriculum:
        """The task's difficulty levels (curriculum=difficulty); a ValueError naming env.task if it has none."""
        return TaskCurriculum(self)


class TaskCurriculum:
    """A reasoning-gym task's difficulty levels: reasoning-gym's curriculum for the task (`create_curriculum`), moved
    a level at a time over all its attributes (`increment_global_level` semantics; the range attributes widen
    inclusively, reasoning-gym's default context: at chain_sum's level 1, 2-3 terms of 1-2 digits). Level 0 is the
    curriculum's first level, which for chain_sum is the demo's config. Training items at level L come from seed +
    L (new questions at each level), keep the env's other `config` keys and leave out the held-out questions."""

    def __init__(self, env: ReasoningGymEnv):
        from reasoning_gym.factory import create_curriculum

        self.env, self.name = env, env.task
        try:
            self._curriculum = create_curriculum(env.task)
        except (ValueError, KeyError) as e:
            raise ValueError(
                f"env.task={env.task!r} has no reasoning-gym curriculum ({e}): use curriculum=pass_rate"
            ) from None
        self.max_level = max(len(a.levels) for a in self._curriculum.attributes.values()) - 1

    @property
    def level(self) -> int:
        return self._curriculum.get_max_level()

    def set_level(self, level: int) -> None:
        self._curriculum.set_global_level(level)

    def task_config(self) -> dict[str, Any]:
        """The task's keyword arguments at the current level (the curriculum's fields over env.config)."""
        import dataclasses

        cfg = self._curriculum.generate_configuration(defaults={**self.env.config, "size": 1, "seed": 0})
        return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("size", "seed")}

    def train_items(self) -> list[dict[str, Any]]:
        import reasoning_gym

        env = self.env
        data = reasoning_gym.create_dataset(env.task, size=env.size, seed=env.seed + self.level, **self.task_config())
        items = [env._item(e) for e in data if e["question"] not in env.held_out]
        for it in items:
            it["metadata"]["curriculum_level"] = self.level
        return items
