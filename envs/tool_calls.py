"""Tool calls in model text, in two formats.

- `hermes`: `<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>`, the format that
  Qwen2.5/Qwen3 (Hermes-style) chat templates teach when given `tools=`; several calls may follow each other.
- `tag`: `<tool>calculator: 2+3</tool>`, for models without a tool template (SmolLM2): the text after the first
  colon, stripped, is the tool's first parameter. The env's system prompt describes the tools and the format.

A malformed call (bad JSON, no name, arguments that are not an object, a tag without `name:`, an unclosed tag) is
returned as an error message: the env sends it back as the tool's result and counts it, and the episode goes on.
The text is the policy's, so any text parses: JSON is read by `load_json`, standard JSON within bounds (nesting,
integer digits, no NaN or Infinity), and whatever it refuses is that call's error, never an exception.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("hermes", "tag")
_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_TAG = re.compile(r"<tool>(.*?)(</tool>|$)", re.DOTALL)
MAX_JSON_DEPTH = 64  # nesting of arrays and objects; a tool's arguments or a request never need more
MAX_INT_DIGITS = 100  # longer integers are refused before Python converts them (4300 digits would raise)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)  # empty for the tag format: see `text`
    text: str | None = None  # the tag format's argument text


def parse_tool_calls(text: str, fmt: str) -> tuple[list[ToolCall], list[str]]:
    """(calls, errors) in the order they appear in `text`; both empty when the text calls no tool."""
    if fmt == "hermes":
        return _parse(text, _HERMES, _hermes_call, "</tool_call>")
    if fmt == "tag":
        return _parse(text, _TAG, _tag_call, "</tool>")
    raise ValueError(f"env.tool_format={fmt!r} is not known; valid: {', '.join(FORMATS)}")


def load_json(text: str) -> Any:
    """`text` as standard JSON within bounds, else ValueError with a short message: NaN and Infinity, numbers that
    overflow a float, integers of more than MAX_INT_DIGITS digits and nesting deeper than MAX_JSON_DEPTH are refused
    (their values could not be sent on as JSON, or cost time and stack to build). Used for the policy's tool calls
    and for the agent endpoint's request bodies (rl/rollout/agents.py)."""
    too_deep = f"not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=_bounded_int, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at character {e.pos})") from None
    except ValueError as e:  # a bound of the hooks below
        raise ValueError(f"not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError(too_deep) from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise ValueError(too_deep)
    return value


def answer_calls(
    episode: Any, calls: list[ToolCall], errors: list[str], max_per_turn: int, run: Callable[[Any, ToolCall], str]
) -> list[str]:
    """One turn's tool results, counted on the episode (envs/protocol.py Episode): each parse error first (a
    malformed call), then `run(episode, call)` for each of the first `max_per_turn` calls (it counts the call and
    a failure), and an error for each call past them."""
    results = [f"error: {e}" for e in errors]
    episode.tool_errors += len(errors)
    episode.malformed_calls += len(errors)
    for k, call in enumerate(calls):
        if k >= max_per_turn:
            results.append(f"error: at most {max_per_turn} tool calls per turn")
            episode.tool_errors += 1
        else:
            results.append(run(episode, call))
    return results


def _parse(text: str, pattern: re.Pattern, one, closing: str) -> tuple[list[ToolCall], list[str]]:
    calls, errors = [], []
    for m in pattern.finditer(text):
        if not m.group(2):
            errors.append(f"the tool call is not closed with {closing}")
            continue
        try:
            calls.append(one(m.group(1).strip()))
        except ValueError as e:
            errors.append(str(e))
    return calls, errors


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a standard JSON number")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(digits)


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"the number {text[:20]} is out of range")
    return x


def _depth(value: Any) -> int:
    """Nesting of arrays and objects (0 for a scalar), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _hermes_call(body: str) -> ToolCall:
    try:
        obj = load_json(body)
    except ValueError as e:
        raise ValueError(f"the tool call is {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        raise ValueError('the tool call must be a JSON object {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = load_json(args)
        except ValueError as e:
            raise ValueError(f"the tool call's arguments are not a JSON object ({e})") from None
    if not isinstance(args, dict):
        raise ValueError("the tool call's arguments must be a JSON object")
    return ToolCall(obj["name"].strip(), args)


def _tag_call(body: str) -> ToolCall:
    name, colon, rest = body.partition(":")
    if not colon or not name.strip() or not re.fullmatch(r"[A-Za-z_][\w.]*", name.strip()):
        raise ValueError("a tool call is <tool>name: input</tool>")
    return ToolCall(name.strip(), text=rest.strip())
