"""Agent code as an environment: `env=agent`. An agent is a function `(base_url, session_id, item) -> reward` that
runs one episode of a task against an OpenAI-compatible endpoint (the `openai` client with `base_url`, the session id
in the `X-Session-ID` header) and returns the episode's reward. The rollout actor serves that endpoint from its own
engine and records every call's tokens (rl/rollout/agents.py), so the agent's own loop, prompts and tool handling
are what is trained, on the exact tokens the actor sampled.

This env holds the agent and the endpoint's bounds; its tasks are an inner single-turn env's items (their messages
are for the agent to use or ignore). `start`/`step` exist only to mark it multi-turn (the resolve step reads the
limits): the actor runs its episodes through the agent, never through them.
"""

from __future__ import annotations

from typing import Any

from envs.protocol import Episode, Message


class AgentEnv:
    """inner: a single-turn env (its items are the tasks); agent: `module.function` of the agent; max_turns: calls
    per episode; max_episode_tokens: tokens after the first prompt (replies and the messages added between calls);
    host: the interface the endpoint listens on (loopback unless set); max_request_bytes: per request (413 above);
    episode_timeout_s: one generate call's agents must finish within it; max_concurrent: agents running at once (the
    endpoint's listen backlog holds as many connections)."""

    def __init__(
        self,
        inner: Any,
        agent: str,
        max_turns: int = 4,
        max_episode_tokens: int = 256,
        host: str = "127.0.0.1",
        max_request_bytes: int = 1 << 20,
        episode_timeout_s: float = 300.0,
        max_concurrent: int = 64,
    ):
        if max_request_bytes < 1 or episode_timeout_s <= 0 or max_concurrent < 1:
            raise ValueError(
                f"env.max_request_bytes={max_request_bytes}, env.episode_timeout_s={episode_timeout_s} and "
                f"env.max_concurrent={max_concurrent} must be positive"
            )
        self.inner, self.agent, self.host = inner, agent, host
        self.max_turns, self.max_episode_tokens = max_turns, max_episode_tokens
        self.max_request_bytes, self.episode_timeout_s, self.max_concurrent = (
            max_request_bytes,
            episode_timeout_s,
            max_concurrent,
        )

    def train_items(self) -> list[dict[str, Any]]:
        return self.inner.train_items()

    def eval_items(self) -> list[dict[str, Any]]:
        return self.inner.eval_items()

    def start(self, item: dict[str, Any]) -> Episode:
        raise NotImplementedError(
            "env=agent: its episodes are the agent's calls to the endpoint (rl/rollout/agents.py)"
        )

    def step(self, episode: Episode, model_text: str) -> list[Message] | None:
        raise NotImplementedError(
            "env=agent: its episodes are the agent's calls to the endpoint (rl/rollout/agents.py)"
        )
