"""reasoning-gym procedural tasks as prompt sources (offline, deterministic by seed)."""

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

        self.task = task
        self.instruction = instruction
        self.system_prompt = system_prompt
        cfg = dict(config or {})
        try:
            pool = reasoning_gym.create_dataset(task, size=max(4 * eval_size, 64), seed=eval_seed, **cfg)
            train = reasoning_gym.create_dataset(task, size=size, seed=seed, **cfg)
        except (ValueError, TypeError, AssertionError) as e:
            raise ValueError(f"env.task={task!r} / env.config={cfg}: {e}") from None
        # held out: the first eval_size distinct questions of the eval generator; training never sees them
        self._eval, held_out = [], set()
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
