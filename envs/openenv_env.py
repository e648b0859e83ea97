"""OpenEnv environments (the `openenv-core` library) on our env protocol: `env=openenv`.

An OpenEnv environment is Gymnasium-shaped: `reset(seed) -> Observation`, `step(Action) -> Observation` with the
observation's `reward` and `done`; its server (`create_app`) wraps that class in WebSocket sessions, one instance
per session. Each episode here is one such session: an instance of the class in the rollout actor's process
(`env: module:Class`), or a session of a running server (`url`, e.g. an OpenEnv container on this machine, through
openenv's own `GenericEnvClient`):

- the prompt is the observation `reset(seed)` returns, as a user message (after `system_prompt`); an item is a seed
  (`size` training seeds, `eval_size` held-out seeds after them, never trained on);
- each model turn becomes the env's Action: the model's text in the action's `action_field` (by default its one
  required field); an action the class rejects is answered with the validation error and counted as malformed;
- the next observation is the next user message, until the observation is `done` or `max_turns`;
- the reward is the sum of the steps' rewards (the episode's return), the episode term `openenv/return`, and
  `reward=episode` (which conf/env/openenv.yaml selects) adds nothing for the last turn.

The token ids are the actor's own (rl/rollout/episodes.py renders the observations with the chat template and
masks them out of the loss). The observation's text is its `observation_field`, or by default its one string field
besides `metadata`, else all its fields but `done`, `reward` and `metadata` as JSON. An action the env rejects (a
validation error in process, any step error from a server) is answered with the error and counted as malformed.
"""

from __future__ import annotations

import importlib
import json
import typing
from typing import Any

from pydantic import ValidationError

from envs.optional import require
from envs.protocol import Episode, Message


def require_openenv() -> Any:
    """`openenv.core` (imported when the env is built, not with this module)."""
    return require("openenv.core", "openenv", "openenv-core")


_OBSERVATION_BASE = {"done", "reward", "metadata"}


def import_path(path: str) -> Any:
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"env: {path!r} is not an import path: write module:Class")
    return getattr(importlib.import_module(module), name)


def action_class(env_cls: type) -> type:
    """The Action class an environment's `step` takes (its annotation)."""
    hints = typing.get_type_hints(env_cls.step)
    cls = hints.get("action")
    if not (isinstance(cls, type) and issubclass(cls, require_openenv().Action)):
        raise TypeError(f"env: {env_cls.__name__}.step has no Action annotation: set env.action=module:ActionClass")
    return cls


def one_field(model: type) -> str | None:
    """The one required field of an Action class besides `metadata`, or None."""
    names = [n for n, f in model.model_fields.items() if n != "metadata" and f.is_required()]
    return names[0] if len(names) == 1 else None


Step = tuple[dict[str, Any], float, bool]  # (observation as JSON, reward, done)


class LocalSession:
    """One episode on an instance of the env class in this process."""

    def __init__(self, env_cls: type, env_args: dict[str, Any], action_cls: type, action_field: str):
        self.env, self.action_cls, self.action_field = env_cls(**env_args), action_cls, action_field

    def reset(self, seed: int) -> Step:
        return self._out(self.env.reset(seed=seed))

    def step(self, text: str) -> Step:
        return self._out(self.env.step(self.action_cls(**{self.action_field: text})))

    def close(self) -> None:
        self.env.close()

    @staticmethod
    def _out(obs: Any) -> Step:
        return obs.model_dump(mode="json"), float(obs.reward or 0.0), bool(obs.done)


class RemoteSession:
    """One episode as a WebSocket session of a running OpenEnv server (its own instance of the env there)."""

    def __init__(self, url: str, action_field: str):
        self.client = require_openenv().GenericEnvClient(base_url=url).sync()
        self.action_field = action_field

    def reset(self, seed: int) -> Step:
        return self._out(self.client.reset(seed=seed))

    def step(self, text: str) -> Step:
        return self._out(self.client.step({self.action_field: text}))

    def close(self) -> None:
        self.client.close()

    @staticmethod
    def _out(result: Any) -> Step:
        return dict(result.observation), float(result.reward or 0.0), bool(result.done)


class OpenEnvEnv:
    """env: `module:Class` of an `openenv.core.Environment`; env_args: its constructor's keyword arguments;
    action: `module:Class` of its Action (default: `step`'s annotation); action_field: the action's field that takes
    the model's text; observation_field: the observation's field shown to the model; system_prompt: before the first
    observation; size / eval_size: training / held-out seeds; seed: the first seed; max_turns: model turns per
    episode; max_episode_tokens: tokens after the prompt (the model's turns and the observations)."""

    def __init__(
        self,
        env: str | None = None,
        env_args: dict[str, Any] | None = None,
        url: str | None = None,
        action: str | None = None,
        action_field: str | None = None,
        observation_field: str | None = None,
        system_prompt: str | None = None,
        size: int = 256,
        eval_size: int = 0,
        seed: int = 0,
        max_turns: int = 4,
        max_episode_tokens: int = 256,
    ):
        openenv = require_openenv()
        if (env is None) == (url is None):
            raise ValueError(
                "env=openenv: set one of env.env (module:Class, in process) and env.url (a running server)"
            )
        if size < 1 or eval_size < 0:
            raise ValueError(f"env.size={size} must be >= 1 and env.eval_size={eval_size} >= 0")
        self.url, self.env_args = url, dict(env_args or {})
        if env is not None:
            self.env_cls = import_path(env)
            if not (isinstance(self.env_cls, type) and issubclass(self.env_cls, openenv.Environment)):
                raise TypeError(f"env.env={env} is not an openenv.core.Environment subclass")
            self.action_cls = import_path(action) if action else action_class(self.env_cls)
            action_field = action_field or one_field(self.action_cls)
            if action_field not in self.action_cls.model_fields:
                raise ValueError(
                    f"env.action_field={action_field}: {self.action_cls.__name__} has no such field; set "
                    f"env.action_field to one of {', '.join(self.action_cls.model_fields)}"
                )
        elif not action_field:
            raise ValueError("env.url: set env.action_field, the action's field that takes the model's text")
        self.action_field, self.observation_field = action_field, observation_field
        self.system_prompt, self.size, self.eval_size, self.seed = system_prompt, size, eval_size, seed
        self.max_turns, self.max_episode_tokens = max_turns, max_episode_tokens

    def session(self) -> LocalSession | RemoteSession:
        if self.url is not None:
            return RemoteSession(self.url, self.action_field)
        return LocalSession(self.env_cls, self.env_args, self.action_cls, self.action_field)

    def observation_text(self, obs: dict[str, Any]) -> str:
        if self.observation_field is not None:
            return str(obs[self.observation_field])
        rest = {k: v for k, v in obs.items() if k not in _OBSERVATION_BASE}
        texts = [k for k, v in rest.items() if isinstance(v, str)]
        return rest[texts[0]] if len(texts) == 1 else json.dumps(rest, default=str)

    def item(self, seed: int) -> dict[str, Any]:
        """The prompt of the episode `reset(seed)` starts (a throwaway session renders it)."""
        session = self.session()
        try:
            obs, _, _ = session.reset(seed)
        finally:
            session.close()
        messages: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": self.observation_text(obs)})
        return {"messages": messages, "answer": "", "metadata": {"seed": seed}}

    def train_items(self) -> list[dict[str, Any]]:
        return [self.item(self.seed + i) for i in range(self.size)]

    def eval_items(self) -> list[dict[str, Any]]:
        return [self.item(self.seed + self.size + i) for i in range(self.eval_size)]

    def start(self, item: dict[str, Any]) -> Episode:
        session = self.session()
        session.reset(item["metadata"]["seed"])
        episode = Episode(item, [dict(m) for m in item["messages"]], state={"session": session})
        episode.terms["openenv/return"] = 0.0
        return episode

    def step(self, episode: Episode, model_text: str) -> list[Message] | None:
        try:
            obs, reward, done = episode.state["session"].step(model_text)
        except (ValidationError, RuntimeError, ConnectionError) as e:  # the action rejected, here or by the server
            episode.tool_errors += 1
            episode.malformed_calls += 1
            error = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e).splitlines()[0]
            text = f"error: invalid action: {error}"
            return None if episode.turns >= self.max_turns else [{"role": "user", "content": text}]
        episode.terms["openenv/return"] += reward
        if done or episode.turns >= self.max_turns:
            return None
        return [{"role": "user", "content": self.observation_text(obs)}]

    def finish(self, episode: Episode, truncated: bool) -> None:
        """The session is this episode's only: close it (its return is already in the terms)."""
        episode.state.pop("session").close()
