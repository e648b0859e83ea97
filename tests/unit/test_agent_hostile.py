"""The agent endpoint (rl/rollout/agents.py, rl/rollout/agent_http.py) and the tool-call parser against hostile
input: failed calls that must leave their session as it was, bounds that must hold before the engine works,
malformed requests that must be a 4xx JSON answer, model text that must never crash the parser, and rewards that
must be finite. Requests go over real HTTP to an endpoint backed by a fake engine; a bounded property-based fuzz of
the whole request path is at the end."""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from contextlib import contextmanager

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from envs.agent_env import AgentEnv
from envs.tool_calls import parse_tool_calls
from envs.tool_task import ToolEnv
from envs.tools import get_tool
from rl.loop.prepare import episode_metrics
from rl.rollout.agent_http import RequestError
from rl.rollout.agents import AgentEndpoint, Batcher, run_agent_episodes
from rl.rollout.episodes import EnvTokens
from rl.types import Completion, EpisodeInfo, EpisodeSpec, PromptRollout, Sampling

DEEP = "[" * 5000 + "]" * 5000
HOSTILE_TEXTS = [
    f"<tool_call>{DEEP}</tool_call>",
    '<tool_call>{"name": "calculator", "arguments": {"expression": ' + "9" * 5000 + "}}</tool_call>",
    '<tool_call>{"name": "calculator", "arguments": {"expression": NaN}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": 1e999}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": "' + "[" * 5000 + '"}</tool_call>',
]
USER = {"role": "user", "content": "What is 2 + 3?"}


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


class ReplyEngine:
    """A fake engine: every prompt is answered `reply`, ending with EOS unless its cap cuts it. Records each call's
    prompts; `fail(prompts)`, when given, runs first and may raise (an engine error)."""

    def __init__(self, tok, reply: str = "The answer is 5.", fail=None):
        self.tok, self.reply, self.fail, self.calls = tok, reply, fail, []

    def __call__(self, prompts, sampling, max_tokens, seeds=None):
        self.calls.append([list(p) for p in prompts])
        if self.fail is not None:
            self.fail(prompts)
        ids = self.tok(self.reply, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        out = []
        for p, cap in zip(prompts, max_tokens or [sampling.max_tokens] * len(prompts)):
            c = Completion(ids[:cap], [-0.5] * len(ids[:cap]), "length" if len(ids) > cap else "stop", self.reply)
            out.append(PromptRollout(list(p), [c], 3))
        return out


def fail_once_on(turn: int):
    """A `fail` for ReplyEngine: the engine's `turn`-th call (1-based, counting its failures) raises once."""
    seen = []

    def fail(prompts):
        seen.append(1)
        if len(seen) == turn:
            raise RuntimeError("engine hiccup")

    return fail


@contextmanager
def serving(tok, engine, max_prompt_tokens=None, **env_kw):
    env = AgentEnv(None, "unused", **env_kw)
    spec = EpisodeSpec("{}", env.max_turns, env.max_episode_tokens, True, max_prompt_tokens)
    batcher = Batcher(engine, Sampling(n=1, max_tokens=16))
    endpoint = AgentEndpoint(batcher, EnvTokens(tok, True), spec, env, 16, 3)
    try:
        yield endpoint
    finally:
        endpoint.close()
        batcher.close()


def request(endpoint, body, sid=None, method="POST", path="/v1/chat/completions", headers=None):
    """(status, JSON payload, response headers) of one request; `body` is sent as given if it is bytes."""
    host, port = endpoint.server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"X-Session-ID": sid or "", **(headers or {})})
    r = conn.getresponse()
    payload = json.loads(r.read() or b"null")
    conn.close()
    return r.status, payload, r.headers


def snapshot(s):
    return (list(s.ids), list(s.logprobs), list(s.mask), len(s.calls), [dict(m) for m in s.history], s.env_tokens)


def second_call(reply: str) -> list[dict]:
    return [USER, {"role": "assistant", "content": reply}, {"role": "tool", "content": "5"}]


# ------------------------------------------------------------------------------ 1. a failed call changes nothing


@pytest.mark.parametrize("failure", ["engine error", "bad parameter", "malformed message"])
def test_a_failed_call_leaves_its_session_unchanged_and_its_retry_gives_the_clean_sample(tok, failure):
    flaky = ReplyEngine(tok, fail=fail_once_on(2) if failure == "engine error" else None)
    with serving(tok, flaky) as a, serving(tok, ReplyEngine(tok)) as b:
        sa, sb = a.open((7, 0)), b.open((7, 0))
        for endpoint, sid in ((a, sa), (b, sb)):
            assert request(endpoint, {"messages": [USER]}, sid)[0] == 200
        messages = second_call(flaky.reply)
        before = snapshot(a.sessions[sa])
        bad = {
            "engine error": {"messages": messages},
            "bad parameter": {"messages": messages, "max_tokens": "many"},
            "malformed message": {"messages": messages[:2] + [{"role": "tool", "content": {"not": "text"}}]},
        }[failure]
        status, payload, _ = request(a, bad, sa)
        assert status == (500 if failure == "engine error" else 400), payload
        assert snapshot(a.sessions[sa]) == before  # nothing of the failed call was kept
        assert request(a, {"messages": messages}, sa)[0] == 200  # the retry
        assert request(b, {"messages": messages}, sb)[0] == 200  # a clean call
        assert snapshot(a.sessions[sa]) == snapshot(b.sessions[sb])


def test_a_retried_call_whose_answer_was_lost_gets_that_answer_again(tok):
    engine = ReplyEngine(tok)
    with serving(tok, engine) as endpoint:
        sid = endpoint.open((7, 0))
        first = request(endpoint, {"messages": [USER]}, sid)
        again = request(endpoint, {"messages": [USER]}, sid)
        assert first[0] == again[0] == 200 and first[1] == again[1]
        assert len(endpoint.sessions[sid].calls) == 1 and len(engine.calls) == 1


def retrying_agent(base_url: str, session_id: str, item: dict) -> float:
    """Two calls with the openai client's default retries (it retries a 5xx answer)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", default_headers={"X-Session-ID": session_id})
    messages = list(item["messages"])
    for _ in range(2):
        reply = client.chat.completions.create(model="rlft-policy", messages=messages)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "tool", "content": "5"},
        ]
    return 1.0


class Tasks:
    def train_items(self):
        return [{"messages": [USER], "answer": "5"}]


def agent_run(tok, engine, agent, n=1, max_prompt_tokens=None, **env_kw):
    env = AgentEnv(Tasks(), agent, **env_kw)
    spec = EpisodeSpec("{}", env.max_turns, env.max_episode_tokens, True, max_prompt_tokens)
    sampling = Sampling(n=n, max_tokens=16)
    return run_agent_episodes(engine, EnvTokens(tok, True), env, env.train_items(), sampling, spec, 3, [5])


def test_the_openai_clients_retry_of_a_failed_call_trains_on_one_turn(tok):
    pytest.importorskip("openai")
    (clean,) = agent_run(tok, ReplyEngine(tok), retrying_agent)
    (retried,) = agent_run(tok, ReplyEngine(tok, fail=fail_once_on(2)), retrying_agent)
    a, b = clean.completions[0], retried.completions[0]
    assert (b.token_ids, b.mask, b.logprobs) == (a.token_ids, a.mask, a.logprobs)
    assert b.episode.turns == 2 and b.episode.messages == a.episode.messages


# ------------------------------------------------------------------------------ 2. bounds hold before any work


def test_a_content_length_that_is_no_byte_count_is_refused_before_the_body_is_read(tok):
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 3000}]}).encode()
    engine = ReplyEngine(tok)
    with serving(tok, engine, max_request_bytes=1000) as endpoint:
        sid = endpoint.open(None)
        for length in ("-1", "+5", "1e3", "", "99999999999999999999999"):
            with socket.create_connection(endpoint.server.server_address[:2], timeout=30) as s:
                head = f"POST /v1/chat/completions HTTP/1.1\r\nX-Session-ID: {sid}\r\nContent-Length: {length}\r\n\r\n"
                s.sendall(head.encode() + body)
                s.shutdown(socket.SHUT_WR)  # a server that reads "to the end" gets the whole oversize body
                answer = b"".join(iter(lambda: s.recv(65536), b""))
            status = int(answer.split()[1])
            assert status in (400, 413), (length, answer[:200])
            assert b"Content-Length" in answer.split(b"\r\n\r\n", 1)[1] or status == 413
        assert engine.calls == []


def test_a_first_prompt_over_max_prompt_tokens_is_refused_before_the_engine(tok):
    engine = ReplyEngine(tok)
    with serving(tok, engine, max_prompt_tokens=64) as endpoint:
        sid = endpoint.open(None)
        status, payload, _ = request(endpoint, {"messages": [{"role": "user", "content": "word " * 500}]}, sid)
        assert status == 413 and "model.max_prompt_tokens=64" in payload["error"]["message"]
        assert engine.calls == [] and endpoint.sessions[sid].prompt_ids is None
        assert request(endpoint, {"messages": [USER]}, sid)[0] == 200


def test_a_call_the_engine_fails_fails_alone_never_the_others_of_its_batch(tok):
    gate = threading.Event()
    poison = 99

    def fail(prompts):
        if prompts == [[0]]:  # the first call holds the engine until both others are queued
            gate.wait()
        if any(poison in p for p in prompts):
            raise ValueError("the prompt is too long for the engine")

    engine = ReplyEngine(tok, fail=fail)
    batcher = Batcher(engine, Sampling(n=1, max_tokens=4))
    results: dict[str, object] = {}

    def call(name, prompt):
        try:
            results[name] = batcher(prompt, 4, 1)
        except ValueError as e:
            results[name] = e

    threads = [
        threading.Thread(target=call, args=(n, p)) for n, p in (("gate", [0]), ("ok", [1, 2]), ("bad", [poison]))
    ]
    try:
        threads[0].start()
        while batcher.requests.qsize() or not engine.calls:  # the gate call is in the engine
            time.sleep(0.001)
        for t in threads[1:]:
            t.start()
        while batcher.requests.qsize() < 2:  # both queued behind it: they go to the engine as one batch
            time.sleep(0.001)
        gate.set()
        for t in threads:
            t.join()
    finally:
        gate.set()
        batcher.close()
    assert [[1, 2], [poison]] in engine.calls  # they were batched
    assert isinstance(results["ok"], Completion) and isinstance(results["bad"], ValueError)


def test_the_server_accepts_every_agent_calling_at_once(tok):
    with serving(tok, ReplyEngine(tok), max_concurrent=48) as endpoint:
        assert endpoint.server.request_queue_size >= 48  # the listen backlog (the standard library's is 5)
        sids = [endpoint.open((i, 0)) for i in range(48)]
        statuses = []
        threads = [
            threading.Thread(target=lambda s=s: statuses.append(request(endpoint, {"messages": [USER]}, s)[0]))
            for s in sids
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert statuses == [200] * 48


def test_a_session_takes_no_call_once_its_agent_returned(tok):
    pytest.importorskip("openai")
    shared: dict[str, object] = {"sids": [], "late": None}
    first_returned = threading.Event()

    def agent(base_url, session_id, item):
        import openai

        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        create = client.chat.completions.create
        create(model="m", messages=[USER], extra_headers={"X-Session-ID": session_id})
        shared["sids"].append(session_id)
        if len(shared["sids"]) == 1:
            first_returned.set()
            return 1.0
        first_returned.wait()
        other = shared["sids"][0]
        for _ in range(500):  # until the other agent's session is closed (its done-callback has run)
            try:
                create(model="m", messages=[USER], extra_headers={"X-Session-ID": other})
            except openai.APIStatusError as e:
                shared["late"] = e.status_code
                break
            time.sleep(0.01)
        return 1.0

    (rollout,) = agent_run(tok, ReplyEngine(tok), agent, n=2)
    assert shared["late"] == 410
    assert [c.episode.turns for c in rollout.completions] == [1, 1]  # the late call did not join the first sample


def test_non_finite_rewards_score_zero_and_are_counted(tok):
    rewards = iter([math.nan, math.inf, "not a number", 0.5])

    def agent(base_url, session_id, item):
        import urllib.request

        req = urllib.request.Request(
            f"{base_url}/chat/completions",
            json.dumps({"messages": [USER]}).encode(),
            {"X-Session-ID": session_id, "Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=30).read()
        return next(rewards)

    (rollout,) = agent_run(tok, ReplyEngine(tok), agent, n=4, max_concurrent=1)
    got = sorted((c.episode.terms["agent/reward"], c.episode.reward_errors) for c in rollout.completions)
    assert got == [(0.0, 1), (0.0, 1), (0.0, 1), (0.5, 0)]
    assert episode_metrics(rollout.completions)["env/reward_errors"] == 3.0


def test_an_envs_non_finite_terms_score_zero_and_are_counted():
    info = EpisodeInfo(turns=1, terms={"nan": math.nan, "inf": -math.inf, "text": "high", "ok": 0.25})
    assert info.terms == {"nan": 0.0, "inf": 0.0, "text": 0.0, "ok": 0.25} and info.reward_errors == 3


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [0, -5])
def test_a_max_tokens_below_one_is_refused(tok, field, value):
    engine = ReplyEngine(tok)
    with serving(tok, engine) as endpoint:
        status, payload, _ = request(endpoint, {"messages": [USER], field: value}, endpoint.open(None))
    assert status == 400 and payload["error"]["param"] == field and engine.calls == []


# ------------------------------------------------------------------------------ 3. malformed requests: 4xx JSON

MALFORMED = [
    (b"[1, 2]", "must be a JSON object"),
    (b'"messages"', "must be a JSON object"),
    (b"", "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"messages": "hi"}', "messages must be a non-empty array"),
    (b'{"messages": []}', "messages must be a non-empty array"),
    (b'{"messages": [1]}', "messages[0] must be an object"),
    (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "messages[0].content[0]"),
    (b'{"messages": [{"role": "user", "content": "hi", "tool_call_id": 3}]}', "tool_call_id"),
    (b'{"messages": [{"role": "user", "content": NaN}]}', "NaN"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e999}', "out of range"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', "n must be 1"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": true}', "n must be a number"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream must be a boolean"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "tools": {}}', "tools must be an array"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"function": 1}]}', "tools[0]"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "user": 5}', "user must be a string"),
    (b'{"messages": ' + DEEP.encode() + b"}", "nested deeper"),
]


def test_every_malformed_request_is_a_4xx_json_answer_naming_what_is_wrong(tok):
    engine = ReplyEngine(tok)
    with serving(tok, engine) as endpoint:
        sid = endpoint.open(None)
        for body, why in MALFORMED:
            status, payload, headers = request(endpoint, body, sid)
            assert status == 400 and why in payload["error"]["message"], (body[:80], status, payload)
            assert headers["Content-Type"] == "application/json" and headers["x-should-retry"] == "false"
        assert engine.calls == [] and endpoint.sessions[sid].prompt_ids is None


def test_content_parts_are_read_as_their_text(tok):
    with serving(tok, ReplyEngine(tok)) as endpoint:
        a, b = endpoint.open(None), endpoint.open(None)
        parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "2 + 3?"}]
        assert request(endpoint, {"messages": [{"role": "user", "content": parts}]}, a)[0] == 200
        assert request(endpoint, {"messages": [{"role": "user", "content": "What is\n2 + 3?"}]}, b)[0] == 200
        assert endpoint.sessions[a].prompt_ids == endpoint.sessions[b].prompt_ids


def test_other_methods_and_routes_get_json_answers(tok):
    with serving(tok, ReplyEngine(tok)) as endpoint:
        status, payload, headers = request(endpoint, b"", method="PUT")
        assert status == 405 and headers["Allow"] == "GET, POST" and "takes POST" in payload["error"]["message"]
        assert request(endpoint, b"", method="GET")[0] == 405
        assert request(endpoint, b"", method="BREW")[0] == 501  # no handler at all: the server's own answer, as JSON
        assert request(endpoint, b"", method="GET", path="/v1/models")[0] == 200
        assert request(endpoint, {"messages": [USER]}, path="/v2/chat")[0] == 404


# ------------------------------------------------------------------------------ 4. model text never crashes


@pytest.mark.parametrize("text", HOSTILE_TEXTS, ids=["deep", "huge int", "NaN", "overflow", "deep string"])
def test_hostile_model_text_is_a_tool_error_in_the_parser_the_tool_env_and_the_endpoint(tok, text):
    calls, errors = parse_tool_calls(text, "hermes")
    assert calls == [] and len(errors) == 1
    env = ToolEnv(Tasks(), tools=["calculator"])
    episode = env.start({"messages": [USER]})
    (result,) = env.step(episode, text)
    assert result["content"].startswith("error: the tool call") and episode.malformed_calls == 1
    with serving(tok, ReplyEngine(tok, reply=text)) as endpoint:
        status, payload, _ = request(endpoint, {"messages": [USER]}, endpoint.open(None))
    assert status == 200 and "tool_calls" not in payload["choices"][0]["message"]


# ------------------------------------------------------------------------------ the request path, fuzzed

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_text_content = st.one_of(
    st.text(max_size=40),
    st.none(),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}), max_size=3),
)
_valid_body = st.fixed_dictionaries(
    {
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _text_content}
            ),
            min_size=1,
            max_size=4,
        )
    },
    optional={
        "max_tokens": st.integers(1, 40),
        "n": st.just(1),
        "stream": st.just(False),
        "tools": st.just([get_tool("calculator").schema]),
        "user": st.text(max_size=8),
        "temperature": st.floats(0, 2),
    },
)


@st.composite
def bodies(draw):
    """A well-formed request, or one with one part replaced by any JSON value: the body, a field, a message's key."""
    body = draw(_valid_body)
    where = draw(st.sampled_from(["nothing", "nothing", "body", "field", "message"]))
    if where == "body":
        return draw(_json)
    if where == "field":
        body[draw(st.sampled_from(["messages", "max_tokens", "max_completion_tokens", "n", "stream", "tools"]))] = draw(
            _json
        )
    if where == "message":
        message = draw(st.sampled_from(body["messages"]))
        message[draw(st.sampled_from(["role", "content", "name", "tool_call_id", "tool_calls"]))] = draw(_json)
    return body


@pytest.fixture(scope="module")
def fuzzed(tok):
    engine = ReplyEngine(tok)
    with serving(tok, engine) as endpoint:
        yield endpoint, engine


@settings(max_examples=200, deadline=None)
@given(body=bodies(), extend=st.booleans())
def test_fuzzed_requests_are_answered_or_refused_with_a_4xx_and_a_refusal_changes_nothing(fuzzed, body, extend):
    """Any JSON body, as a first call or as the next call of a session that has one reply: 200, or a RequestError
    4xx and the session as it was. (`respond` is the request path without the socket; agent_http.py's handler
    turns its RequestError into the JSON answer tested above.)"""
    endpoint, engine = fuzzed
    sid = endpoint.open((1, 0))
    if extend:
        endpoint.respond("POST", "/v1/chat/completions", sid, json.dumps({"messages": [USER]}).encode())
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            body = {**body, "messages": second_call(engine.reply)[:2] + body["messages"]}
    before = snapshot(endpoint.sessions[sid])
    try:
        status, payload = endpoint.respond("POST", "/v1/chat/completions", sid, json.dumps(body).encode())
    except RequestError as e:
        event(f"refused {e.status}: {str(e)[:25]}")
        assert 400 <= e.status < 500, e
        assert snapshot(endpoint.sessions[sid]) == before
    else:
        event("answered")
        assert status == 200 and payload["choices"][0]["message"]["role"] == "assistant"
        json.dumps(payload, allow_nan=False)
