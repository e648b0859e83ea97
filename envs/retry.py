"""Retry: any single-turn environment as a multi-turn one. A wrong answer gets feedback and another turn.

The env judges each answer with `judge` (a reward function, by default the run's reward: conf/env/retry.yaml sets
`judge: ${reward}`); at or above `threshold` the episode ends, else the model reads `feedback` and answers again,
up to `max_turns` answers. The run's reward scores the last answer; with `discount` < 1 a per-episode term
(`retry_discount`) scales a correct last answer by discount ** (answers - 1), so answering right at once pays most.
"""

from __future__ import annotations

import random
from typing import Any

from envs.protocol import ContextTurn, Episode, Message


class RetryEnv:
    """inner: a single-turn env (its items are the prompts); judge: `(completions, *, answer, metadata) -> rewards`;
    max_turns: answers at most; max_episode_tokens: tokens after the prompt (answers and feedback); feedback: the
    user message after a wrong answer; discount: per extra answer (1: none); threshold: judge score that is right."""

    def __init__(
        self,
        inner: Any,
        judge: Any,
        max_turns: int = 3,
        max_episode_tokens: int = 160,
        feedback: str = "That is not correct, try again.",
        discount: float = 1.0,
        threshold: float = 1.0,
    ):
        if not 0 < discount <= 1:
            raise ValueError(f"env.discount={discount} must be in (0, 1]")
        if max_turns < 1:
            raise ValueError(f"env.max_turns={max_turns} must be >= 1")
        self.inner, self.judge = inner, judge
        self.max_turns, self.max_episode_tokens = max_turns, max_episode_tokens
        self.feedback, self.discount, self.threshold = feedback, discount, threshold

    def train_items(self) -> list[dict[str, Any]]:
        return self.inner.train_items()

    def eval_items(self) -> list[dict[str, Any]]:
        return self.inner.eval_items()

    def start(self, item: dict[str, Any]) -> Episode:
        return Episode(item, [dict(m) for m in item["messages"]])

    def demonstrate(self, episode: Episode, rng: random.Random) -> str:
        """The next turn of a demonstration (python -m rl.tools.demos) that uses the feedback: a wrong answer first
        (a number near the right one, or "I am not sure." when the answer is not a number), as context only (a
        warm start should not learn to answer wrong), then the inner env's right answer."""
        item = episode.item
        if episode.turns > 0:
            return self.inner.answer_text(item)
        try:
            wrong = int(item["answer"]) + rng.choice([-10, -2, -1, 1, 2, 10])
        except ValueError:
            return ContextTurn("I am not sure.")
        return ContextTurn(f"The answer is {wrong}.")

    def step(self, episode: Episode, model_text: str) -> list[Message] | None:
        item = episode.item
        score = float(self.judge([model_text], answer=[item["answer"]], metadata=[item.get("metadata", {})])[0])
        if score >= self.threshold or episode.turns >= self.max_turns:
            if self.discount < 1:
                episode.terms["retry_discount"] = (self.discount ** (episode.turns - 1) - 1) * score
            return None
        return [{"role": "user", "content": self.feedback}]
