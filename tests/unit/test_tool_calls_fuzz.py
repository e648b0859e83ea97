"""Property-based fuzzing (hypothesis, bounded) of what reads untrusted text: the tool-call parser reads the
policy's text (envs/tool_calls.py), the endpoint's request reader an agent's bytes (rl/rollout/agent_http.py). For
any input each returns a result or refuses it in its own terms (a tool error; a 4xx), never raises anything else."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from envs.tool_calls import MAX_JSON_DEPTH, ToolCall, load_json, parse_tool_calls
from rl.rollout.agent_http import ChatRequest, RequestError, parse_request

BOUNDED = settings(max_examples=300, deadline=None)

# pieces that make parser-relevant text more likely than plain random strings do
_pieces = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<tool>",
        "</tool>",
        '{"name": "calculator", "arguments": ',
        '{"expression": "2+3"}',
        '"{\\"code\\": 1}"',
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        '"',
        "NaN",
        "-Infinity",
        "1e999",
        '{"name": "c", "arguments": {"x": ',
        "}}",
        "9" * 120,
        "9" * 5000,  # past Python's integer-string limit
        "[" * 80,
        "[" * 2000,  # past the interpreter's recursion limit
        "null",
        "calculator: 1+1",
        "\\u0000",
    ]
)
_joined = st.lists(_pieces | st.text(max_size=5), max_size=30).map("".join)
texts = st.one_of(st.text(), _joined, _joined.map(lambda body: f"<tool_call>{body}</tool_call>"))
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@BOUNDED
@given(text=texts, fmt=st.sampled_from(["hermes", "tag"]))
def test_any_text_parses_into_calls_and_errors(text, fmt):
    calls, errors = parse_tool_calls(text, fmt)
    opening = "<tool_call>" if fmt == "hermes" else "<tool>"
    assert len(calls) + len(errors) <= text.count(opening)
    assert all(isinstance(e, str) and e for e in errors)
    for call in calls:
        assert isinstance(call, ToolCall) and call.name.strip() == call.name and call.name
        json.dumps(call.arguments, allow_nan=False)  # what the endpoint sends back as the call's arguments


@BOUNDED
@given(name=st.text(min_size=1).filter(str.strip), arguments=st.dictionaries(st.text(), _json, max_size=4))
def test_a_well_formed_hermes_call_parses_back_to_itself(name, arguments):
    try:
        body = json.dumps({"name": name, "arguments": arguments}, allow_nan=False)
    except ValueError:  # NaN or Infinity among the arguments: no standard JSON to send
        return
    calls, errors = parse_tool_calls(f"<tool_call>{body}</tool_call>", "hermes")
    if "</tool_call>" in body:  # a closing tag inside the JSON ends the call early: an error, not a crash
        return
    assert errors == [] and [(c.name, c.arguments) for c in calls] == [(name.strip(), arguments)]


@BOUNDED
@given(text=texts | _json.map(json.dumps))
def test_load_json_returns_standard_bounded_json_or_a_value_error(text):
    try:
        value = load_json(text)
    except ValueError as e:
        assert str(e).startswith("not valid JSON")
    else:
        assert json.loads(json.dumps(value, allow_nan=False)) == value
        depth, todo = 0, [(value, 0)]
        while todo:
            v, d = todo.pop()
            depth = max(depth, d)
            if isinstance(v, dict | list):
                todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
        assert depth <= MAX_JSON_DEPTH


@BOUNDED
@given(raw=st.one_of(st.binary(max_size=200), texts.map(str.encode), _json.map(lambda v: json.dumps(v).encode())))
def test_any_request_body_is_read_or_refused_with_a_400(raw):
    try:
        request = parse_request(raw)
    except RequestError as e:
        assert e.status == 400 and str(e)
    else:
        assert isinstance(request, ChatRequest) and request.messages
        assert all(isinstance(m["content"], str) and m["role"] for m in request.messages)
        assert request.max_tokens is None or request.max_tokens >= 1
