"""Tools: plain Python functions registered by name, with the JSON schema chat templates take as `tools=`.

    @tool
    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: e.g. "12 * (3 + 4)"
        '''

The schema comes from the signature (parameter names, types from the annotations, required = no default) and the
docstring (its first paragraph describes the tool; `name: text` lines under `Args:` describe the parameters).
A tool returns text (the tool message the model reads) and raises to report an error (the error's message is the
tool message, and the episode goes on). Envs name their tools (`env.tools=[calculator, python]`): a built-in name,
or `package.module.function` for a tool of your own (importing the module registers it), so each rollout actor
finds the same functions by name.

Built-ins: `calculator` (arithmetic parsed with `ast`, never `eval`, with bounds on sizes) and `python` (code run
in the sandbox of envs/sandbox.py, imported when the tool first runs).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]  # {"type": "function", "function": {name, description, parameters}}

    def __call__(self, **arguments: Any) -> str:
        return str(self.fn(**arguments))

    @property
    def first_param(self) -> str | None:
        """The parameter that the plain tag format's text goes to (envs/tool_calls.py)."""
        names = list(self.schema["function"]["parameters"]["properties"])
        return names[0] if names else None


TOOLS: dict[str, Tool] = {}
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None):
    """Register `fn` as a tool under `name` (default: its function name); a second tool of the same name fails."""

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        key = name or f.__name__
        if key in TOOLS and TOOLS[key].fn is not f:
            raise ValueError(f"tool {key!r} is registered twice ({TOOLS[key].fn.__module__} and {f.__module__})")
        TOOLS[key] = Tool(key, f, schema_of(f, key))
        return f

    return deco(fn) if fn is not None else deco


def get_tool(name: str) -> Tool:
    """A registered tool by name; `package.module.function` imports the module first (its @tool registers it)."""
    if name not in TOOLS and "." in name:
        module, _, attr = name.rpartition(".")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"env.tools: cannot import {name!r} ({e})") from None
        key = next((k for k, t in TOOLS.items() if t.fn is fn), None)
        if key is None:
            raise ValueError(f"env.tools: {name} is not decorated with @envs.tools.tool")
        return TOOLS[key]
    if name not in TOOLS:
        raise ValueError(
            f"env.tools: {name!r} is not a known tool; valid: {', '.join(sorted(TOOLS))} or module.function"
        )
    return TOOLS[name]


def schema_of(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    """The OpenAI/Hermes function schema of `fn`, from its signature and docstring."""
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    arg_docs: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
        elif in_args and ":" in line and line.startswith((" ", "\t")):
            key, _, text = line.strip().partition(":")
            arg_docs[key.strip()] = text.strip()
        elif in_args and line.strip() and not line.startswith((" ", "\t")):
            in_args = False
    hints = inspect.get_annotations(fn, eval_str=True)
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        prop: dict[str, Any] = {"type": JSON_TYPES.get(hints.get(p.name), "string")}
        if p.name in arg_docs:
            prop["description"] = arg_docs[p.name]
        properties[p.name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


# ------------------------------------------------------------------------------------------------ calculator

MAX_EXPRESSION_CHARS = 500
MAX_DIGITS = 100  # |result| < 10**100: integers stay small, and huge powers are refused before they are computed
MAX_EXPONENT = 1000
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _check_size(x: int | float) -> int | float:
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError("result is not a finite number")
    if abs(x) >= 10**MAX_DIGITS:
        raise ValueError(f"number too large (more than {MAX_DIGITS} digits)")
    return x


def _power(base: int | float, exp: int | float) -> int | float:
    if abs(exp) > MAX_EXPONENT:
        raise ValueError(f"exponent too large (|exponent| <= {MAX_EXPONENT})")
    if abs(base) > 1 and exp > 0 and exp * math.log10(abs(base)) >= MAX_DIGITS:
        raise ValueError(f"number too large (more than {MAX_DIGITS} digits)")
    if base == 0 and exp < 0:
        raise ValueError("division by zero")
    result = base**exp
    if isinstance(result, complex):
        raise ValueError("a negative number to a fractional power is not a real number")
    return result


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check_size(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise ValueError("division by zero")
        return _check_size(_BINARY[type(node.op)](left, right))
    raise ValueError(f"unsupported syntax {type(node).__name__}: use numbers, + - * / // % ** and parentheses")


def format_number(x: int | float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return str(x) if isinstance(x, int) else f"{x:.12g}"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.

    Args:
        expression: the expression, e.g. "1234 * 5678 + 9"
    """
    text = str(expression).strip().replace("^", "**").replace("×", "*").replace(",", "")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression too long (at most {MAX_EXPRESSION_CHARS} characters)")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError(f"cannot parse {text[:80]!r} as arithmetic") from None
    try:
        return format_number(_evaluate(tree))
    except (OverflowError, ZeroDivisionError, RecursionError):
        raise ValueError("the result is out of range") from None


# ------------------------------------------------------------------------------------------------ python

MAX_TOOL_OUTPUT_CHARS = 2000


@tool
def python(code: str) -> str:
    """Run Python code in a sandbox (no network, time and memory limits) and return what it prints.

    Args:
        code: a Python program; print() what you want to see
    """
    from envs.sandbox import run_python  # the sandbox module, imported where the tool runs

    result = run_python(str(code))
    out = (result.stdout or "")[-MAX_TOOL_OUTPUT_CHARS:]
    if result.timed_out or result.error or result.exit_code != 0:
        why = "timed out" if result.timed_out else (result.error or f"exit code {result.exit_code}")
        raise RuntimeError(f"{why}\n{out}{(result.stderr or '')[-MAX_TOOL_OUTPUT_CHARS:]}".strip())
    return out if out.strip() else "(no output: print() the result)"
