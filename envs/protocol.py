"""The environment protocol: a prompt source, and for multi-turn environments an episode's next messages.

Every environment is a prompt source: `train_items()` and `eval_items()` give items `{messages, answer, metadata}`
(plus `tools`, JSON schemas the chat template offers, when the env has tools). That is all a single-turn
environment is: its episode is one model turn, scored by the run's reward (today's envs need no change).

A multi-turn environment adds `start(item) -> Episode` and `step(episode, model_text) -> messages | None`, and the
limits `max_turns` and `max_episode_tokens`. The rollout actor (rl/rollout/episodes.py) runs the loop:

    episode = env.start(item)                       # the item's messages are the prompt
    loop: the model answers (one engine call for every active episode of the step)
          episode.turns += 1; the answer is appended to episode.messages
          messages = env.step(episode, answer_text)  # tool results, feedback ... or None: done
          messages are appended (their tokens from the chat template, out of the loss)

Each model turn is capped at model.max_new_tokens (a cut turn goes to the env like any other). An episode also
ends at `max_turns` model turns, or as truncated (finish_reason "length") when it reaches `max_episode_tokens`
(every token after the prompt, the model's and the environment's) or the env's next messages would not fit; an
episode whose last model turn was cut is "length" too, so the truncation filters see it. The reward comes at the end: the run's reward function scores the last model
turn (outcome) and the env's per-episode terms (`episode.terms`, name -> value) are added to it. An env that judges
the whole episode may define `finish(episode, truncated)`: called once when an episode ends, however it ends, before
its terms are read (envs/verifiers_env.py scores a verifiers rubric there). This is the shape
of verifiers' MultiTurnEnv (`env_response` / `is_completed`) and SkyRL-Gym's `init` / `step`.

The env runs where the episodes run: each rollout actor builds its own copy from the env's config (a `_target_`
node, carried in rl/types.py's EpisodeSpec), so an env and its tools hold plain data and are built from keyword
arguments.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]  # a chat message: {"role": ..., "content": ...} (tool messages may add "name")


class ContextTurn(str):
    """A model turn of a demonstration (an env's `demonstrate`) that sets the scene but is not to be imitated, such
    as the wrong first answer before the feedback: a warm start trains on the turns after it, not on it
    (rl/tools/demos.py marks it `"train": false`, rl/data/demos.py masks it out)."""


@dataclass
class Episode:
    """One conversation in progress. The env keeps what it needs in `state`; counters are reported as metrics."""

    item: dict[str, Any]
    messages: list[Message]  # the conversation so far: the prompt's messages, then each turn's
    turns: int = 0  # model turns so far
    state: dict[str, Any] = field(default_factory=dict)
    terms: dict[str, float] = field(default_factory=dict)  # per-episode reward terms, added to the outcome reward
    tool_calls: int = 0  # well-formed tool calls the env ran
    tool_errors: int = 0  # malformed calls, unknown tools and tools that raised
    malformed_calls: int = 0  # of those, calls the env could not parse (the tool format not followed)
    tool_seconds: float = 0.0  # time spent in tools


@runtime_checkable
class Environment(Protocol):
    """A prompt source: every environment."""

    def train_items(self) -> list[dict[str, Any]]: ...

    def eval_items(self) -> list[dict[str, Any]]: ...


@runtime_checkable
class MultiTurnEnvironment(Environment, Protocol):
    """An environment that answers the model: `step` returns the next messages, or None when the episode is done."""

    max_turns: int  # model turns at most per episode
    max_episode_tokens: int  # tokens after the prompt per episode (model and environment tokens)

    def start(self, item: dict[str, Any]) -> Episode: ...

    def step(self, episode: Episode, model_text: str) -> list[Message] | None: ...


def is_multi_turn(env_or_class: Any) -> bool:
    """Whether an env (or its class) runs episodes of several turns: it has `start` and `step`."""
    return callable(getattr(env_or_class, "start", None)) and callable(getattr(env_or_class, "step", None))


def episode_limits(cls: type, kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(max_turns, max_episode_tokens) of a multi-turn env class built with `kwargs` (its constructor's defaults
    where they are not given), read without building it; None for a single-turn env."""
    if not is_multi_turn(cls):
        return None
    params = inspect.signature(cls).parameters
    limits = []
    for name in ("max_turns", "max_episode_tokens"):
        if name in kwargs:
            limits.append(int(kwargs[name]))
        elif name in params and params[name].default is not inspect.Parameter.empty:
            limits.append(int(params[name].default))
        else:
            raise ValueError(f"env: {cls.__name__} is multi-turn but has no default for {name}: set env.{name}")
    max_turns, max_tokens = limits
    if max_turns < 1 or max_tokens < 1:
        raise ValueError(f"env.max_turns={max_turns} and env.max_episode_tokens={max_tokens} must be >= 1")
    return max_turns, max_tokens
