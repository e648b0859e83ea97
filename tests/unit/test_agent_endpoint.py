"""env=agent (envs/agent_env.py, rl/rollout/agents.py): agent code calls the actor's OpenAI-compatible endpoint with
the real `openai` client (here backed by a scripted engine); every call is recorded and a session's calls become one
multi-turn sample of the engine's own tokens, the messages the agent added between calls masked out."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from envs.agent_env import AgentEnv  # noqa: E402
from envs.tools import get_tool  # noqa: E402
from rl.rollout.agents import run_agent_episodes  # noqa: E402
from rl.rollout.episodes import EnvTokens  # noqa: E402
from rl.seeds import turn_seed  # noqa: E402
from rl.types import EpisodeSpec, Sampling  # noqa: E402
from tests.fakes import ScriptedEngine  # noqa: E402

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


class Tasks:
    def train_items(self):
        return [{"messages": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"}]

    eval_items = train_items


def calculator_agent(base_url: str, session_id: str, item: dict) -> float:
    """A 30-line agent loop: call the model, run its tool calls, until it answers (docs/environments.md)."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", default_headers={"X-Session-ID": session_id})
    messages, tools = list(item["messages"]), [get_tool("calculator").schema]
    for _ in range(4):
        reply = client.chat.completions.create(model="rlft-policy", messages=messages, tools=tools)
        message = reply.choices[0].message
        messages.append({"role": "assistant", "content": message.content})
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = get_tool(call.function.name)(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return float(item["answer"] in (message.content or ""))


def broken_agent(base_url: str, session_id: str, item: dict) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])  # no session id: 404
    return 1.0


class SeededEngine(ScriptedEngine):
    """ScriptedEngine whose answer is chosen by each request's seed (`answers[seed]`, else `default`), so a session
    gets the same answers whichever calls share an engine batch."""

    def __init__(self, tok, answers: dict[int, str], default: str):
        super().__init__(tok, [[default]])
        self.answers, self.default = answers, default

    def __call__(self, prompts, sampling, max_tokens, seeds=None):
        out = []
        for i, p in enumerate(prompts):
            self.script = [[self.answers.get(seeds[i], self.default)]]
            out += super().__call__([p], sampling, None if max_tokens is None else [max_tokens[i]], [seeds[i]])
        return out


def make_env(agent, **kw) -> AgentEnv:
    return AgentEnv(Tasks(), agent, **kw)


def run(tok, env, engine, n=2, seeds=None):
    spec = EpisodeSpec("{}", env.max_turns, env.max_episode_tokens, True)
    env_tokens = EnvTokens(tok, True)
    items = env.train_items()
    return engine, run_agent_episodes(engine, env_tokens, env, items, Sampling(n=n, max_tokens=48), spec, 3, seeds)


def test_an_agent_loop_trains_on_the_tokens_each_call_sampled(tok):
    env = make_env(calculator_agent)
    engine = SeededEngine(tok, {11: CALL, 12: "I think 6."}, "The answer is 5.")
    engine, (rollout,) = run(tok, env, engine, seeds=[11])
    first, second = rollout.completions
    # sample 0 (seed 11) called the calculator and answered; sample 1 (seed 12) answered at once
    assert [m["role"] for m in first.episode.messages] == ["assistant", "tool", "assistant"]
    assert first.episode.turns == 2 and first.episode.tool_calls == 1 and second.episode.turns == 1
    assert first.episode.terms == {"agent/reward": 1.0} and second.episode.terms == {"agent/reward": 0.0}
    call_ids = tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    answer_ids = tok("The answer is 5.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert [t for t, m in zip(first.token_ids, first.mask) if m] == call_ids + answer_ids  # the engine's tokens
    assert first.token_ids[: len(call_ids)] == call_ids and first.token_ids[-len(answer_ids) :] == answer_ids
    assert tok.decode([t for t, m in zip(first.token_ids, first.mask) if not m]).count("5") == 1  # the tool result
    assert all(lp == 0.0 for lp, m in zip(first.logprobs, first.mask) if not m)
    # a later call's prompt is the earlier tokens themselves: the first prompt + the reply + the tool message
    seeds = [s for call in engine.seeds for s in call]
    # sample k's first call seeded with seed + k, as vLLM's n > 1; its later calls as episodes' turns (any order)
    assert sorted(seeds) == sorted([11, 12, turn_seed(11, 0, 1)])
    assert first.finish_reason == "stop" and rollout.adapter_version == 3


def test_the_endpoint_refuses_unknown_sessions_and_the_agent_error_is_one_line(tok):
    env = make_env(broken_agent)
    with pytest.raises(RuntimeError, match="made no call to the endpoint: it raised NotFoundError"):
        run(tok, env, ScriptedEngine(tok, [["x"]]), n=1)


def test_a_session_is_capped_at_max_turns(tok):
    env = make_env(calculator_agent, max_turns=2)
    _, (rollout,) = run(tok, env, ScriptedEngine(tok, [[CALL]]), n=1)
    (c,) = rollout.completions
    # the third call is refused (400): the agent raises, its episode scores 0 and counts as truncated
    assert c.episode.turns == 2 and c.episode.terms == {"agent/reward": 0.0} and c.finish_reason == "length"
