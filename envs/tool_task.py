"""Tool use: any single-turn environment whose model may call tools before it answers.

Each turn the env parses the model's text for tool calls (envs/tool_calls.py). With calls, it runs them and
answers with one tool message each (a malformed call, an unknown tool or a tool that raises answers with the error
and counts in `tool_errors`); without, the text is the final answer and the episode ends. The run's reward scores
that final answer.

Formats: `hermes` offers the tools through the chat template (items carry `tools`, JSON schemas, which the prompt
is rendered with; results are `tool` messages), for models whose template has tools (Qwen2.5, Qwen3). `tag`
describes the tools and `<tool>name: input</tool>` in the system prompt and answers with a user message
`<result>...</result>`, for models without (SmolLM2).
"""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

from envs.protocol import Episode, Message
from envs.tool_calls import ToolCall, answer_calls, parse_tool_calls
from envs.tools import Tool, get_tool

TAG_PROMPT = (
    "You can use tools. To call one, write <tool>NAME: INPUT</tool> and stop; the result comes back as "
    "<result>...</result>. Tools:\n{tools}\nWhen you know the answer, give it without a tool call."
)
HERMES_PROMPT = "Use the tools when they help. When you know the answer, give it without a tool call."


class ToolEnv:
    """inner: a single-turn env (its items are the prompts); tools: tool names (envs/tools.py); tool_format: hermes
    | tag; max_turns: model turns at most (tool calls and the answer); max_episode_tokens: tokens after the prompt;
    max_calls_per_turn: calls run per turn (more are errors); system_prompt: replaces the format's instructions."""

    def __init__(
        self,
        inner: Any,
        tools: list[str] = ("calculator",),
        tool_format: str = "hermes",
        max_turns: int = 4,
        max_episode_tokens: int = 256,
        max_calls_per_turn: int = 4,
        system_prompt: str | None = None,
    ):
        parse_tool_calls("", tool_format)  # an unknown format fails here, when the env is built (before the run starts)
        self.inner, self.tool_format = inner, tool_format
        self.tools: dict[str, Tool] = {t.name: t for t in (get_tool(n) for n in tools)}
        self.max_turns, self.max_episode_tokens, self.max_calls_per_turn = (
            max_turns,
            max_episode_tokens,
            max_calls_per_turn,
        )
        if system_prompt is None:
            listing = "\n".join(f"- {t.name}: {t.schema['function']['description']}" for t in self.tools.values())
            system_prompt = TAG_PROMPT.format(tools=listing) if tool_format == "tag" else HERMES_PROMPT
        self.system_prompt = system_prompt

    def _with_tools(self, item: dict[str, Any]) -> dict[str, Any]:
        messages = [dict(m) for m in item["messages"]]
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{self.system_prompt}"
        else:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        out = dict(item, messages=messages)
        if self.tool_format == "hermes":
            out["tools"] = [t.schema for t in self.tools.values()]
        return out

    def train_items(self) -> list[dict[str, Any]]:
        return [self._with_tools(it) for it in self.inner.train_items()]

    def eval_items(self) -> list[dict[str, Any]]:
        return [self._with_tools(it) for it in self.inner.eval_items()]

    def start(self, item: dict[str, Any]) -> Episode:
        return Episode(item, [dict(m) for m in item["messages"]])

    def step(self, episode: Episode, model_text: str) -> list[Message] | None:
        calls, errors = parse_tool_calls(model_text, self.tool_format)
        if (not calls and not errors) or episode.turns >= self.max_turns:
            return None
        results = answer_calls(episode, calls, errors, self.max_calls_per_turn, self._run)
        if self.tool_format == "tag":
            return [{"role": "user", "content": "\n".join(f"<result>{r}</result>" for r in results)}]
        return [{"role": "tool", "content": r} for r in results]

    def demonstrate(self, episode: Episode, rng: random.Random) -> str:
        """The next turn of a demonstration (python -m rl.tools.demos): a well-formed calculator call on the task's
        expression (reasoning-gym arithmetic items carry it in their metadata), then the answer the tool returned."""
        if episode.tool_calls == 0:
            expression = episode.item.get("metadata", {}).get("expression")
            if expression is None or "calculator" not in self.tools:
                raise ValueError(
                    "env: demonstrations of tool use need the calculator tool and items with metadata.expression"
                )
            if self.tool_format == "tag":
                return f"<tool>calculator: {expression}</tool>"
            call = {"name": "calculator", "arguments": {"expression": expression}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        result = re.sub(r"</?result>", "", str(episode.messages[-1]["content"])).strip()
        return f"The answer is {result}."

    def _run(self, episode: Episode, call: ToolCall) -> str:
        t0 = time.perf_counter()
        episode.tool_calls += 1
        try:
            tool = self.tools.get(call.name)
            if tool is None:
                raise ValueError(f"unknown tool {call.name!r}; tools: {', '.join(self.tools)}")
            args = call.arguments if call.text is None else ({tool.first_param: call.text} if tool.first_param else {})
            return tool(**args)
        except Exception as e:  # noqa: BLE001 - any failure of a tool is the model's to read, and is counted
            episode.tool_errors += 1
            return f"error: {type(e).__name__}: {e}" if not isinstance(e, ValueError) else f"error: {e}"
        finally:
            episode.tool_seconds += time.perf_counter() - t0
