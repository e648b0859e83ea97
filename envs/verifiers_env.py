"""verifiers environments (the `verifiers` library, its v1 API) on our env protocol: `env=verifiers`.

A verifiers environment is a taskset (`vf.Taskset`, yielding `vf.Task`s: a prompt, a system prompt and the task's
own fields) whose Task class judges a finished conversation with its rubric: the `@vf.reward` methods, weighted and
summed (`vf.Trace.reward`). verifiers runs an agent program (a harness) that reaches the model through its own
interception server; here the rollout actor is the agent. It plays each task the way verifiers' tool-less chat loop
(the `null` harness) does, so the episode is ours (rl/rollout/episodes.py): the token ids the actor sampled, the
env's messages rendered by the chat template and masked out of the loss. Nothing is re-tokenised.

- Single-turn: a task without tools is one model turn.
- Multi-turn: the task's toolsets (`Task.toolsets`, `vf.Toolset` with `@vf.tool` methods) are offered through the
  chat template (`tools=`); each model turn's `<tool_call>` calls (hermes format) run in this process and answer
  with tool messages, until a turn calls no tool or `max_turns`.
- The reward: when an episode ends (`finish`, however it ends) its conversation becomes a `vf.Trace` and the
  task's own `score` runs; each weighted reward is an episode term `vf/<name>`, and `reward=episode` (which
  conf/env/verifiers.yaml selects) adds nothing for the last turn. `@vf.metric` values are kept on the episode.

The taskset is named as verifiers names it (`taskset: <id>`, an installed package exporting its Taskset) or by
import path (`taskset: module:Class`); `taskset_args` fill its config. Not supported (an error says so): multi-agent
`vf.Env` classes (user simulators, agents as judges), harness programs that execute code, tools or rewards that need
a runtime box (rewards needing one are skipped by verifiers' own `score`), toolsets with shared state.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import random
import threading
from typing import Any

from envs.optional import require
from envs.protocol import Episode, Message
from envs.tool_calls import ToolCall, answer_calls, parse_tool_calls
from envs.tools import schema_of


def require_verifiers() -> Any:
    """`verifiers.v1` (imported when the env is built, not with this module)."""
    return require("verifiers.v1", "verifiers", "verifiers")


def run_async(coro: Any) -> Any:
    """Run a coroutine to its end from sync code: verifiers' scoring and tools are async; the rollout actor is not,
    but may be called from a thread that has an event loop running (then the coroutine gets its own thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def load_taskset(taskset: str, args: dict[str, Any]) -> Any:
    """A verifiers taskset by id (an installed package, as `vf.load_taskset` finds it) or by `module:Class`."""
    vf = require_verifiers()
    from verifiers.v1.utils.generic import concrete_type

    if ":" in taskset:
        module, _, name = taskset.partition(":")
        cls = getattr(importlib.import_module(module), name)
        if not (isinstance(cls, type) and issubclass(cls, vf.Taskset)):
            raise TypeError(f"env.taskset={taskset} is not a verifiers Taskset subclass")
        config_cls = concrete_type(cls, vf.TasksetConfig) or vf.TasksetConfig
        return cls(config_cls(**args))
    return vf.load_taskset(vf.TasksetConfig(id=taskset, **args))


class VerifiersTools:
    """The `@vf.tool` methods of a task's toolsets, by the name the model calls them (verifiers' `<server>_<tool>`,
    or the bare name with `TOOL_PREFIX = None`), with their JSON schemas for the chat template."""

    def __init__(self, toolsets: list[Any]):
        vf = require_verifiers()
        from verifiers.v1.utils.decorators import discover_decorated

        self.functions: dict[str, Any] = {}
        for toolset in toolsets:
            if toolset._state_cls is not vf.State:
                raise ValueError(f"env: toolset {type(toolset).__name__} keeps shared state, which env=verifiers lacks")
            run_async(toolset.setup())
            prefix = toolset.server_name
            for fn in discover_decorated(toolset, "tool"):
                name = getattr(fn, "tool_name", None) or fn.__name__
                self.functions[f"{prefix}_{name}" if prefix else name] = fn
        self.schemas = [schema_of(fn, name) for name, fn in self.functions.items()]

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        fn = self.functions.get(name)
        if fn is None:
            raise ValueError(f"unknown tool {name!r}; tools: {', '.join(self.functions)}")
        result = fn(**arguments)
        if inspect.isawaitable(result):
            result = run_async(result)
        return result if isinstance(result, str) else json.dumps(result, default=str)


def vf_message(m: Message, index: int) -> dict[str, Any]:
    """One of our chat messages as verifiers' wire message (an assistant turn's hermes calls become `tool_calls`;
    a tool message answers the call at the same position of the turn before it)."""
    role, content = m["role"], str(m.get("content") or "")
    if role == "assistant":
        calls, _ = parse_tool_calls(content, "hermes")
        out: dict[str, Any] = {"role": role, "content": content}
        if calls:
            out["tool_calls"] = [
                {"id": f"call_{index}_{k}", "name": c.name, "arguments": json.dumps(c.arguments)}
                for k, c in enumerate(calls)
            ]
        return out
    if role == "tool":
        return {"role": role, "content": content, "tool_call_id": str(m.get("tool_call_id", f"call_{index}"))}
    return {"role": role, "content": content}


def build_trace(task: Any, messages: list[Message], n_prompt: int, truncated: bool) -> Any:
    """A `vf.Trace` of one episode, enough for the task's rubric: the message graph as one branch, the model's
    turns marked sampled (verifiers' `assistant_messages`, `last_reply`), tool results after their calls."""
    vf = require_verifiers()
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask

    nodes, call_ids = [], []
    for i, m in enumerate(messages):
        wire = vf_message(m, i)
        if wire["role"] == "assistant":
            call_ids = [c["id"] for c in wire.get("tool_calls") or []]
        elif wire["role"] == "tool" and call_ids:
            wire["tool_call_id"] = call_ids.pop(0)
        sampled = i >= n_prompt and wire["role"] == "assistant"
        nodes.append(MessageNode.model_validate({"parent": i - 1 if i else None, "message": wire, "sampled": sampled}))
    trace = vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
        is_completed=True,
        ok=True,
        stop_condition="max_output_tokens" if truncated else None,
    )
    return trace


class VerifiersEnv:
    """taskset: a verifiers taskset id, or `module:Class`; taskset_args: its config's fields; eval_size: tasks held
    out for evaluation (after a seeded shuffle), never trained on; seed: that shuffle's; max_turns: model turns per
    episode (tool calls and the answer); max_episode_tokens: tokens after the prompt, the model's and the tools';
    max_calls_per_turn: tool calls run per turn (more are errors)."""

    def __init__(
        self,
        taskset: str,
        taskset_args: dict[str, Any] | None = None,
        eval_size: int = 0,
        seed: int = 0,
        max_turns: int = 4,
        max_episode_tokens: int = 256,
        max_calls_per_turn: int = 4,
    ):
        if eval_size < 0:
            raise ValueError(f"env.eval_size={eval_size} must be >= 0")
        self.taskset = load_taskset(taskset, taskset_args or {})
        self.task_cls = type(self.taskset).task_type()
        self.data_cls = self.task_cls.data_type()
        self.eval_size, self.seed = eval_size, seed
        self.max_turns, self.max_episode_tokens, self.max_calls_per_turn = (
            max_turns,
            max_episode_tokens,
            max_calls_per_turn,
        )
        self.tools = VerifiersTools(self.task_cls.toolsets(self.taskset.config.task))
        self._split: tuple[list[dict], list[dict]] | None = None

    def _items(self) -> tuple[list[dict], list[dict]]:
        if self._split is None:
            items = [self.item(t) for t in self.taskset]
            random.Random(self.seed).shuffle(items)
            if self.eval_size >= len(items):
                raise ValueError(f"env.eval_size={self.eval_size} leaves none of the {len(items)} tasks to train on")
            self._split = (items[self.eval_size :], items[: self.eval_size])
        return self._split

    def train_items(self) -> list[dict[str, Any]]:
        return self._items()[0]

    def eval_items(self) -> list[dict[str, Any]]:
        return self._items()[1]

    def item(self, task: Any) -> dict[str, Any]:
        """One task as a prompt item: its system prompt and prompt as chat messages, its data (JSON) in the
        metadata, where each rollout actor rebuilds the task to score it."""
        data = task.data
        messages: list[Message] = []
        if data.system_prompt:
            messages.append({"role": "system", "content": data.system_prompt})
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            from verifiers.v1.types import content_text

            messages += [{"role": m.role, "content": content_text(m.content)} for m in data.prompt or []]
        if not messages:
            raise ValueError(f"env: verifiers task {data.idx} has no prompt (a user-opened task needs a user agent)")
        item: dict[str, Any] = {
            "messages": messages,
            "answer": str(getattr(data, "answer", "") or ""),
            "metadata": {"vf_task": data.model_dump(mode="json", exclude_defaults=True)},
        }
        if self.tools.schemas:
            item["tools"] = self.tools.schemas
        return item

    def start(self, item: dict[str, Any]) -> Episode:
        task = self.task_cls(self.data_cls.model_validate(item["metadata"]["vf_task"]), self.taskset.config.task)
        return Episode(item, [dict(m) for m in item["messages"]], state={"task": task})

    def step(self, episode: Episode, model_text: str) -> list[Message] | None:
        if not self.tools.functions or episode.turns >= self.max_turns:
            return None
        calls, errors = parse_tool_calls(model_text, "hermes")
        if not calls and not errors:
            return None
        results = answer_calls(episode, calls, errors, self.max_calls_per_turn, self._run)
        return [{"role": "tool", "content": r} for r in results]

    def _run(self, episode: Episode, call: ToolCall) -> str:
        episode.tool_calls += 1
        try:
            return self.tools.call(call.name, call.arguments)
        except Exception as e:  # noqa: BLE001 - a failing tool is the model's to read, and is counted
            episode.tool_errors += 1
            return f"error: {type(e).__name__}: {e}"

    def finish(self, episode: Episode, truncated: bool) -> None:
        """The task's rubric on the whole episode: its weighted rewards become the episode's terms."""
        task = episode.state["task"]
        trace = build_trace(task, episode.messages, len(episode.item["messages"]), truncated)
        run_async(task.score(trace))
        for name, r in trace.rewards.items():
            episode.terms[f"vf/{name}"] = 0.0 if r is None else r.value
        episode.state["metrics"] = {k: v for k, v in trace.metrics.items() if v is not None}
