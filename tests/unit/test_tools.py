"""Tools, tool-call parsing and the shipped multi-turn envs' steps (no model): envs/tools.py, envs/tool_calls.py,
envs/tool_task.py, envs/retry.py, and the example of docs/environments.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envs.protocol import is_multi_turn
from envs.retry import RetryEnv
from envs.tool_calls import parse_tool_calls
from envs.tool_task import ToolEnv
from envs.tools import TOOLS, calculator, get_tool, schema_of, tool

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "expr, want",
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("-4 + 10", "6"),
        ("--3", "3"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("1.5 * 4", "6"),
        ("0.1 + 0.2", "0.3"),
        ("123456789 * 987654321", "121932631112635269"),
        ("1,234 * 2", "2468"),
        ("3 ^ 2", "9"),
    ],
)
def test_calculator_evaluates_arithmetic(expr, want):
    assert calculator(expr) == want


@pytest.mark.parametrize(
    "expr, why",
    [
        ("9**9**9", "exponent too large"),
        ("10**1000", "too large"),
        ("2**100000", "exponent too large"),
        ("10**200", "too large"),
        ("99999999999999999999 ** 50", "too large"),
        ("(10**99) * (10**99)", "too large"),
        ("1e308 * 10", "too large"),
        ("1e99 * 1e99", "too large"),
        ("2.0 ** 999", "too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("__import__('os').system('true')", "unsupported syntax"),
        ("open('/etc/passwd').read()", "unsupported syntax"),
        ("x + 1", "unsupported syntax"),
        ("(1).__class__", "unsupported syntax"),
        ("[1] * 10**8", "unsupported syntax"),
        ("'a' * 10", "unsupported syntax"),
        ("True + 1", "unsupported syntax"),
        ("lambda: 1", "unsupported syntax"),
        ("1 +", "cannot parse"),
        ("(" * 300 + "1" + ")" * 300, "too long"),
        ("1" * 501, "too long"),
    ],
)
def test_calculator_refuses_hostile_or_huge_input(expr, why):
    """Refused before anything large is computed (9**9**9 computed would take hours and gigabytes)."""
    with pytest.raises(ValueError, match=why):
        calculator(expr)


def test_schema_from_signature_and_docstring():
    s = TOOLS["calculator"].schema["function"]
    assert s["name"] == "calculator" and s["description"].startswith("Evaluate an arithmetic expression")
    assert s["parameters"]["properties"]["expression"]["type"] == "string"
    assert "1234 * 5678" in s["parameters"]["properties"]["expression"]["description"]
    assert s["parameters"]["required"] == ["expression"]

    def lookup(key: str, limit: int = 3, exact: bool = False) -> str:
        """Find a key.

        Args:
            key: what to find
            limit: at most this many
        """
        return key

    p = schema_of(lookup, "lookup")["function"]["parameters"]
    assert p["properties"] == {
        "key": {"type": "string", "description": "what to find"},
        "limit": {"type": "integer", "description": "at most this many"},
        "exact": {"type": "boolean"},
    }
    assert p["required"] == ["key"]


def test_registry_names_and_errors():
    assert get_tool("calculator").fn is calculator
    assert get_tool("tests.unit.test_tools.shout").name == "shout"  # module.function imports and registers it
    with pytest.raises(ValueError, match="not a known tool; valid: .*calculator"):
        get_tool("calculater")
    with pytest.raises(ValueError, match="registered twice"):
        tool(lambda expression: expression, name="calculator")


@tool
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


def test_hermes_tool_calls_good_and_malformed():
    text = (
        'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>\n'
        '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n</tool_call>'
    )
    calls, errors = parse_tool_calls(text, "hermes")
    assert [(c.name, c.arguments) for c in calls] == [
        ("calculator", {"expression": "2+3"}),
        ("python", {"code": "print(1)"}),
    ]
    assert errors == []
    assert parse_tool_calls("The answer is 5.", "hermes") == ([], [])
    bad = [
        ("<tool_call>{name: calculator}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "JSON object"),
        ('<tool_call>["calculator"]</tool_call>', "JSON object"),
        ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "arguments must be a JSON object"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}', "not closed"),
    ]
    for text, why in bad:
        calls, errors = parse_tool_calls(text, "hermes")
        assert calls == [] and len(errors) == 1 and why in errors[0], (text, errors)


def test_tag_tool_calls_good_and_malformed():
    calls, errors = parse_tool_calls("First <tool>calculator: 12 * (3 + 4)</tool> then <tool>shout:hi</tool>", "tag")
    assert [(c.name, c.text) for c in calls] == [("calculator", "12 * (3 + 4)"), ("shout", "hi")] and errors == []
    for text in ("<tool>calculator 2+3</tool>", "<tool>: 2+3</tool>", "<tool>two words: x</tool>", "<tool>calc: 1"):
        calls, errors = parse_tool_calls(text, "tag")
        assert calls == [] and len(errors) == 1, text
    with pytest.raises(ValueError, match="tool_format='xml'"):
        parse_tool_calls("", "xml")


class Items:
    """A single-turn env of two fixed questions."""

    def train_items(self):
        return [{"messages": [{"role": "user", "content": "What is 1234 * 5678?"}], "answer": "7006652"}]

    def eval_items(self):
        return self.train_items()


def test_tool_env_runs_calls_and_counts_errors():
    env = ToolEnv(Items(), tools=["calculator"], tool_format="hermes", max_turns=3)
    assert is_multi_turn(env) and not is_multi_turn(Items())
    item = env.train_items()[0]
    assert item["tools"][0]["function"]["name"] == "calculator" and item["messages"][0]["role"] == "system"
    ep = env.start(item)
    ep.turns = 1
    text = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1234*5678"}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{bad json}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "9**9**9"}}</tool_call>'
    )
    msgs = env.step(ep, text)
    assert [m["role"] for m in msgs] == ["tool"] * 4
    contents = [m["content"] for m in msgs]
    assert contents[0].startswith("error: the tool call is not valid JSON")  # parse errors first
    assert contents[1] == "7006652"
    assert "unknown tool 'nope'" in contents[2] and "exponent too large" in contents[3]
    assert (ep.tool_calls, ep.tool_errors) == (3, 3) and ep.tool_seconds > 0
    assert ep.malformed_calls == 1  # the bad JSON: the format not followed (env/tool_calls_wellformed_frac 3/4)
    assert env.step(ep, "The answer is 7006652.") is None  # no call: the final answer
    ep.turns = 3
    assert env.step(ep, text) is None  # max_turns reached


def test_tool_env_tag_format_answers_as_user_results():
    env = ToolEnv(Items(), tools=["calculator"], tool_format="tag")
    item = env.train_items()[0]
    assert "tools" not in item and "<tool>NAME: INPUT</tool>" in item["messages"][0]["content"]
    ep = env.start(item)
    ep.turns = 1
    assert env.step(ep, "<tool>calculator: 1234 * 5678</tool>") == [
        {"role": "user", "content": "<result>7006652</result>"}
    ]


def test_python_tool_runs_in_the_sandbox():
    pytest.importorskip("envs.sandbox")
    assert get_tool("python")(code="print(6 * 7)").strip() == "42"
    with pytest.raises(RuntimeError):
        get_tool("python")(code="raise SystemExit(3)")


def exact(completions, *, answer, **_):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def test_retry_env_gives_feedback_until_right_and_discounts():
    env = RetryEnv(Items(), judge=exact, max_turns=3, discount=0.5)
    item = env.train_items()[0]
    ep = env.start(item)
    ep.turns = 1
    assert env.step(ep, "42") == [{"role": "user", "content": "That is not correct, try again."}]
    ep.turns = 2
    assert env.step(ep, "7006652") is None
    assert ep.terms == {"retry_discount": -0.5}  # right at the second answer: 1 + (0.5 - 1) * 1 = 0.5
    ep = env.start(item)
    ep.turns = 3
    assert env.step(ep, "1") is None and ep.terms == {"retry_discount": 0.0}  # out of turns, wrong: nothing to scale
    with pytest.raises(ValueError, match="env.discount"):
        RetryEnv(Items(), judge=exact, discount=0)


def test_docs_example_runs():
    """The complete example of docs/environments.md runs as written."""
    doc = (REPO / "docs" / "environments.md").read_text()
    block = re.search(r"```python\n(# example: .*?)```", doc, re.DOTALL).group(1)
    assert len(block.strip().splitlines()) <= 40
    scope: dict = {"__name__": "docs_example"}
    exec(compile(block, "docs/environments.md", "exec"), scope)
    env = scope["LetterEnv"]()
    assert is_multi_turn(env)
    item = env.train_items()[0]
    assert item["tools"][0]["function"]["name"] == "count_letter" and item["answer"] == "3"
    ep = env.start(item)
    ep.turns = 1
    call = '<tool_call>{"name": "count_letter", "arguments": {"word": "strawberry", "letter": "r"}}</tool_call>'
    assert env.step(ep, call) == [{"role": "tool", "content": "3"}]
    bad = '<tool_call>{"name": "count_letter", "arguments": {"word": "x"}}</tool_call>'
    assert env.step(ep, bad)[0]["content"].startswith("error:")
    assert (ep.tool_calls, ep.tool_errors) == (2, 1)
    assert env.step(ep, "There are 3.") is None
