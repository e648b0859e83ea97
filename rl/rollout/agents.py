"""Agent code that speaks the OpenAI API, trained through the rollout actor: an OpenAI-compatible endpoint on the
actor (`POST /v1/chat/completions`, with tools) and the runner that plays an agent env's episodes through it.

For an agent env (envs/agent_env.py: an `agent` function `(base_url, session_id, item) -> reward`) the actor starts
the endpoint on loopback (`env.host`), opens one session per episode (`sampling.n` per item) and runs the agent
function of each in a thread; the agent calls the endpoint with the `openai` client, passing its session id in the
`X-Session-ID` header. Each call is sampled by the actor's engine (calls of all sessions waiting at once go to the
engine as one batch) with the run's sampling, not the request's (the behaviour policy is the run's), and recorded:
prompt and completion token ids, behaviour logprobs, the adapter version.

A session's calls become one multi-turn sample, exactly as rl/rollout/episodes.py lays out an episode: the first
call's prompt, then each reply's sampled tokens (loss mask 1) and the tokens of the messages the agent added before
its next call (tool results, user turns: rendered by the chat template as a delta after the reply, `EnvTokens`; loss
mask 0). So a later call's prompt is the earlier tokens themselves, never the conversation re-tokenised; an agent
that rewrites the history it got back is refused (HTTP 400). The agent's return value is the episode's reward
(term `agent/reward`); `reward=episode` adds nothing for the last reply.

Bounds: only the runner's open sessions are served (404 otherwise), requests over `env.max_request_bytes` get 413,
a session's calls are capped at `env.max_turns` and its tokens after the prompt at `env.max_episode_tokens` (then
the episode is truncated and further calls get 400), each reply at `model.max_new_tokens` (a request's
`max_tokens` may only lower it), and an episode at `env.episode_timeout_s` (its session is closed; the agent's
later calls fail). `n` must be 1; streaming is not offered.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from envs.tool_calls import parse_tool_calls
from rl.seeds import turn_seed
from rl.types import Completion, EpisodeInfo, EpisodeSpec, PromptRollout, Sampling

# `generate` below is the engine's one call, rl/rollout/episodes.py's TurnFn (that module imports this one)
MODEL_NAME = "rlft-policy"
SESSION_HEADER = "X-Session-ID"


class RequestError(Exception):
    """A request the endpoint refuses: its HTTP status and the message the client reads."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Session:
    """One episode's calls: the sample they make (prompt_ids + ids, mask 1 on the sampled tokens)."""

    seed: tuple[int, int] | None  # (its prompt's seed, its sample index)
    prompt_ids: list[int] | None = None  # the first call's prompt
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)  # the conversation as of the last reply
    calls: list[dict[str, Any]] = field(default_factory=list)  # each call's record
    tools: list[dict] | None = None
    n_prompt_messages: int = 0  # the first call's messages: the conversation after them is the episode's
    finish: str = "stop"
    last_text: str = ""
    env_tokens: int = 0
    tool_calls: int = 0
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def same_message(sent: dict[str, Any], ours: dict[str, Any]) -> bool:
    """Whether a message the agent sent back is the one the conversation had (the client may add null fields)."""
    return sent.get("role") == ours.get("role") and (sent.get("content") or "") == (ours.get("content") or "")


def reply_message(text: str) -> dict[str, Any]:
    """A reply as OpenAI's chat message: hermes `<tool_call>` blocks become `tool_calls` (content keeps the text)."""
    calls, _ = parse_tool_calls(text, "hermes")
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in calls
        ]
    return message


class Batcher:
    """The engine for the endpoint's handler threads: calls that wait at the same time go to the engine as one
    batch (as one turn of every episode does in rl/rollout/episodes.py); the engine is called from one thread."""

    def __init__(self, generate: Callable[..., list[PromptRollout]], sampling: Sampling):
        self.generate, self.sampling = generate, replace(sampling, n=1)
        self.requests: queue.Queue = queue.Queue()
        self.worker = threading.Thread(target=self._run, daemon=True)
        self.worker.start()

    def __call__(self, prompt: list[int], max_tokens: int, seed: int | None) -> Completion:
        done: dict[str, Any] = {"event": threading.Event()}
        self.requests.put((prompt, max_tokens, seed, done))
        done["event"].wait()
        if "error" in done:
            raise done["error"]
        return done["completion"]

    def close(self) -> None:
        self.requests.put(None)
        self.worker.join()

    def _run(self) -> None:
        while True:
            first = self.requests.get()
            if first is None:
                return
            batch = [first]
            time.sleep(0.005)  # let the other agents' calls of this turn arrive
            while not self.requests.empty():
                nxt = self.requests.get()
                if nxt is None:
                    self.requests.put(None)
                    break
                batch.append(nxt)
            seeds = [b[2] for b in batch]
            try:
                outs = self.generate(
                    [b[0] for b in batch], self.sampling, [b[1] for b in batch], None if None in seeds else seeds
                )
                for b, out in zip(batch, outs):
                    b[3]["completion"] = out.completions[0]
            except Exception as e:  # noqa: BLE001 - every waiting call gets the engine's error
                for b in batch:
                    b[3]["error"] = e
            for b in batch:
                b[3]["event"].set()


class AgentEndpoint:
    """The OpenAI-compatible endpoint of one generate call's sessions (module docstring)."""

    def __init__(self, batcher: Batcher, env_tokens: Any, spec: EpisodeSpec, env: Any, turn_cap: int, version: int):
        self.batcher, self.env_tokens, self.spec, self.env = batcher, env_tokens, spec, env
        self.tokenizer = env_tokens.tokenizer
        self.turn_cap, self.version = turn_cap, version
        self.sessions: dict[str, Session] = {}
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # the actor's log is for errors, not one line per call
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                try:
                    if self.path.rstrip("/") != "/v1/chat/completions":
                        raise RequestError(404, f"no route {self.path}; the endpoint serves /v1/chat/completions")
                    size = int(self.headers.get("Content-Length") or 0)
                    if size > endpoint.env.max_request_bytes:
                        raise RequestError(413, f"request of {size} bytes; env.max_request_bytes allows fewer")
                    body = json.loads(self.rfile.read(size) or b"{}")
                    sid = self.headers.get(SESSION_HEADER) or body.get("user")
                    self._send(200, endpoint.complete(sid, body))
                except RequestError as e:
                    self._send(e.status, {"error": {"message": str(e)}})
                except json.JSONDecodeError as e:
                    self._send(400, {"error": {"message": f"invalid JSON: {e}"}})
                except Exception as e:  # noqa: BLE001 - the engine's error, as the client's answer
                    self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((env.host, 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        host, port = self.server.server_address[:2]
        self.base_url = f"http://{host}:{port}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def open(self, seed: tuple[int, int] | None) -> str:
        sid = uuid.uuid4().hex
        self.sessions[sid] = Session(seed)
        return sid

    def complete(self, sid: str | None, body: dict[str, Any]) -> dict[str, Any]:
        session = self.sessions.get(sid or "")
        if session is None:
            raise RequestError(
                404, f"unknown session {sid!r}: pass the session id given to the agent in {SESSION_HEADER}"
            )
        if int(body.get("n") or 1) != 1 or body.get("stream"):
            raise RequestError(400, "n must be 1 and stream false")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "messages must be a non-empty list")
        with session.lock:  # one call of a session at a time: each continues the last one's tokens
            prompt, budget = self._prompt(session, messages, body.get("tools"))
            cap = min(self.turn_cap, budget, int(body.get("max_completion_tokens") or body.get("max_tokens") or budget))
            k = len(session.calls)
            # the first call is the k-th sample of its prompt (vLLM seeds it with seed + k); later ones as episodes' turns
            seed = None if session.seed is None else (sum(session.seed) if k == 0 else turn_seed(*session.seed, k))
            c = self.batcher(prompt, max(cap, 1), seed)
            if session.closed:
                raise RequestError(408, "the episode's time is up (env.episode_timeout_s)")
            session.ids += c.token_ids
            session.logprobs += c.logprobs
            session.mask += [1] * len(c.token_ids)
            session.last_text, session.finish = c.text, c.finish_reason
            message = reply_message(c.text)
            session.tool_calls += len(message.get("tool_calls", []))
            session.history = [dict(m) for m in messages] + [{"role": "assistant", "content": c.text}]
            session.calls.append(
                {
                    "prompt_ids": prompt,
                    "completion_ids": c.token_ids,
                    "logprobs": c.logprobs,
                    "version": self.version,
                    "finish_reason": c.finish_reason,
                }
            )
        finish = "tool_calls" if "tool_calls" in message else c.finish_reason
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(c.token_ids),
                "total_tokens": len(prompt) + len(c.token_ids),
            },
        }

    def _prompt(self, s: Session, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], int]:
        """The call's prompt tokens and the episode's tokens left; a first call renders the messages, a later one
        continues the session's tokens with the delta of the messages added since its last reply."""
        if s.closed:
            raise RequestError(408, "the episode's time is up (env.episode_timeout_s)")
        if len(s.calls) >= self.spec.max_turns:
            raise RequestError(400, f"the episode has made its {self.spec.max_turns} calls (env.max_turns)")
        if s.prompt_ids is None:
            s.tools, s.n_prompt_messages = tools, len(messages)
            kwargs = {"tools": tools} if tools else {}
            if self.spec.use_chat_template:
                enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
                s.prompt_ids = list(self.tokenizer(enc, add_special_tokens=False)["input_ids"])
            else:
                text = "\n".join(str(m.get("content") or "") for m in messages)
                s.prompt_ids = list(self.tokenizer(text)["input_ids"])
            return list(s.prompt_ids), self.spec.max_tokens
        n = len(s.history)
        if len(messages) <= n or not all(same_message(a, b) for a, b in zip(messages[:n], s.history)):
            raise RequestError(400, "a session's messages must extend its last call's messages and reply unchanged")
        new = messages[n:]
        ids = self.env_tokens.encode(new, s.ids[-1] if s.ids else None, s.tools)
        left = self.spec.max_tokens - len(s.ids) - len(ids)
        if left <= 0:
            s.finish = "length"
            raise RequestError(400, f"the episode's tokens are spent (env.max_episode_tokens={self.spec.max_tokens})")
        s.ids += ids
        s.logprobs += [0.0] * len(ids)
        s.mask += [0] * len(ids)
        s.env_tokens += len(ids)
        return s.prompt_ids + s.ids, left


def common_prefix(seqs: list[list[int]]) -> list[int]:
    out = seqs[0]
    for s in seqs[1:]:
        k = 0
        while k < min(len(out), len(s)) and out[k] == s[k]:
            k += 1
        out = out[:k]
    return list(out)


def session_completion(s: Session, group_prompt: list[int], reward: float, failed: bool) -> Completion:
    """A session as a multi-turn completion after the group's shared prompt (tokens of its own first prompt past
    that prefix come first, out of the loss)."""
    own = s.prompt_ids[len(group_prompt) :]
    info = EpisodeInfo(
        turns=len(s.calls),
        tool_calls=s.tool_calls,
        env_tokens=s.env_tokens + len(own),
        terms={"agent/reward": reward},
        messages=s.history[s.n_prompt_messages :],
    )
    finish = "length" if failed else s.finish
    return Completion(own + s.ids, [0.0] * len(own) + s.logprobs, finish, s.last_text, [0] * len(own) + s.mask, info)


def run_agent_episodes(
    generate: Callable[..., list[PromptRollout]],
    env_tokens: Any,
    env: Any,
    items: list[dict],
    sampling: Sampling,
    spec: EpisodeSpec,
    version: int,
    seeds: list[int] | None = None,
) -> list[PromptRollout]:
    """`sampling.n` episodes of `env.agent` per item through the endpoint; rollouts in item order. `env_tokens`
    renders the messages an agent adds between calls (rl/rollout/episodes.py EnvTokens). An agent that
    raises or runs past `env.episode_timeout_s` scores 0 and its episode counts as truncated; an agent that never
    called the endpoint is an error of its code."""
    from hydra.utils import get_method

    agent = get_method(env.agent) if isinstance(env.agent, str) else env.agent
    batcher = Batcher(generate, sampling)
    endpoint = AgentEndpoint(batcher, env_tokens, spec, env, sampling.max_tokens, version)
    sids = [
        [endpoint.open(None if seeds is None else (seeds[i], k)) for k in range(sampling.n)] for i in range(len(items))
    ]
    pool = ThreadPoolExecutor(max_workers=env.max_concurrent)
    errors: dict[str, BaseException] = {}
    try:
        futures = [[pool.submit(agent, endpoint.base_url, sid, item) for sid in g] for g, item in zip(sids, items)]
        deadline = time.monotonic() + env.episode_timeout_s
        results: list[list[tuple[float, bool]]] = []
        for group, futs in zip(sids, futures):
            results.append([])
            for sid, fut in zip(group, futs):
                try:
                    results[-1].append((float(fut.result(timeout=max(deadline - time.monotonic(), 0.0))), False))
                except FutureTimeout:
                    results[-1].append((0.0, True))
                except Exception as e:  # noqa: BLE001 - the agent's own error: its episode scores 0
                    errors[sid] = e
                    results[-1].append((0.0, True))
    finally:
        for session in endpoint.sessions.values():  # a timed-out agent's next call is refused, so its thread ends
            session.closed = True
        pool.shutdown(wait=False, cancel_futures=True)
        endpoint.close()
        batcher.close()
    rollouts = []
    for group, res in zip(sids, results):
        sessions = [endpoint.sessions[sid] for sid in group]
        for sid, s in zip(group, sessions):
            if s.prompt_ids is None:
                why = (
                    f"it raised {type(errors[sid]).__name__}: {errors[sid]}" if sid in errors else "it never called it"
                )
                raise RuntimeError(f"env.agent={env.agent} made no call to the endpoint: {why}")
        prompt = common_prefix([s.prompt_ids for s in sessions])
        completions = [session_completion(s, prompt, r, failed) for s, (r, failed) in zip(sessions, res)]
        rollouts.append(PromptRollout(prompt, completions, version))
    return rollouts
