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

A call changes its session only when it succeeds: its work (the prompt tokens, every bound) is computed first,
then the engine samples, then the session takes the call's tokens in one step. So a refused or failed call leaves
the sample as it was, a retry of it gives the sample a clean call would have given (the same seed), and a retry of
a call that succeeded but whose answer was lost gets that answer again instead of a second turn.

Bounds, each checked before the engine works (rl/rollout/agent_http.py reads and checks the request itself): only
the runner's open sessions are served (404), a request's size is `env.max_request_bytes` (413), the first prompt's
tokens `model.max_prompt_tokens` (413; the engine has room for it and the episode's tokens, so no call of another
session is failed by it), a session's calls `env.max_turns` and its tokens after the prompt
`env.max_episode_tokens` (then the episode is truncated and further calls get 400), each reply
`model.max_new_tokens` (a request's `max_tokens` may only lower it), and a session lasts until its agent returns or
`env.episode_timeout_s` passes (410 after). `n` must be 1; streaming is not offered. docs/environments.md lists the
status codes. The module is past 400 lines because the session's one-step commit needs the call's whole path (turn,
engine batch, answer) in one place.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from typing import Any

from envs.tool_calls import parse_tool_calls
from rl.rollout.agent_http import SESSION_HEADER, AgentServer, ChatRequest, RequestError, parse_request
from rl.seeds import turn_seed
from rl.types import Completion, EpisodeInfo, EpisodeSpec, PromptRollout, Sampling

# `generate` below is the engine's one call, rl/rollout/episodes.py's TurnFn (that module imports this one lazily)
MODEL_NAME = "rlft-policy"
log = logging.getLogger(__name__)


@dataclass
class Session:
    """One episode's calls: the sample they make (prompt_ids + ids, mask 1 on the sampled tokens). Only a call that
    succeeds changes it (`AgentEndpoint._commit`), under `lock`; `refusal` is set once the episode is over."""

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
    last: tuple[list[dict[str, Any]], dict[str, Any]] | None = None  # the last call's messages and its answer
    refusal: RequestError | None = None  # why later calls are refused: the episode is over
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self, refusal: RequestError) -> None:
        """End the episode: later calls get `refusal`; a call in flight finishes (and counts) first."""
        with self.lock:
            self.refusal = self.refusal or refusal


@dataclass(frozen=True)
class Turn:
    """A call's work, computed before anything of its session changes."""

    prompt: list[int]  # the engine's prompt
    first_prompt: list[int] | None  # the first call's rendered messages (None for a later call)
    env_ids: list[int]  # a later call: the tokens of the messages the agent added since the last reply (mask 0)
    cap: int  # the reply's token cap
    seed: int | None


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
    batch (as one turn of every episode does in rl/rollout/episodes.py); the engine is called from one thread.
    A batch the engine fails is run again call by call, so that one call's failure is its own only."""

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
            try:
                self._generate(batch)
            except Exception as e:  # noqa: BLE001 - each call's handler answers its own error
                if len(batch) == 1:
                    batch[0][3]["error"] = e
                for b in batch if len(batch) > 1 else []:  # the batch again, call by call (same seeds, same samples)
                    try:
                        self._generate([b])
                    except Exception as own:  # noqa: BLE001
                        b[3]["error"] = own
            for b in batch:
                b[3]["event"].set()

    def _generate(self, batch: list[tuple]) -> None:
        seeds = [b[2] for b in batch]
        outs = self.generate(
            [b[0] for b in batch], self.sampling, [b[1] for b in batch], None if None in seeds else seeds
        )
        for b, out in zip(batch, outs):
            b[3]["completion"] = out.completions[0]


class AgentEndpoint:
    """The OpenAI-compatible endpoint of one generate call's sessions (module docstring)."""

    def __init__(self, batcher: Batcher, env_tokens: Any, spec: EpisodeSpec, env: Any, turn_cap: int, version: int):
        self.batcher, self.env_tokens, self.spec, self.env = batcher, env_tokens, spec, env
        self.tokenizer = env_tokens.tokenizer
        self.turn_cap, self.version = turn_cap, version
        self.sessions: dict[str, Session] = {}
        self.server = AgentServer(env.host, env.max_concurrent, env.max_request_bytes, self.respond)
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

    def respond(self, method: str, path: str, session_header: str | None, body: bytes) -> tuple[int, dict[str, Any]]:
        """One request's answer (rl/rollout/agent_http.py reads it off the socket); RequestError for a refusal."""
        route = path.split("?")[0].rstrip("/")
        methods = {"/v1/models": "GET", "/v1/chat/completions": "POST"}
        if route not in methods:
            raise RequestError(404, f"no route {path[:80]}; the endpoint serves POST /v1/chat/completions")
        if method != methods[route]:
            raise RequestError(405, f"{method} {route}: the route takes {methods[route]}")
        if method == "GET":
            return 200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]}
        request = parse_request(body)
        return 200, self.complete(session_header or request.user, request)

    def complete(self, sid: str | None, request: ChatRequest) -> dict[str, Any]:
        session = self.sessions.get(sid or "")
        if session is None:
            raise RequestError(
                404, f"unknown session {str(sid)[:40]!r}: pass the session id given to the agent in {SESSION_HEADER}"
            )
        with session.lock:  # one call of a session at a time: each continues the last one's tokens
            if session.refusal is not None:
                raise RequestError(session.refusal.status, str(session.refusal))
            if session.last is not None and request.messages == session.last[0]:
                return session.last[1]  # the client retried a call that succeeded (its answer was lost): same answer
            turn = self._turn(session, request)
            c = self.batcher(turn.prompt, turn.cap, turn.seed)
            message = reply_message(c.text)
            finish = "tool_calls" if "tool_calls" in message else c.finish_reason
            n_prompt = len(turn.prompt)
            response = {
                "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": MODEL_NAME,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": len(c.token_ids),
                    "total_tokens": n_prompt + len(c.token_ids),
                },
            }
            self._commit(session, request, turn, c, response)
        return response

    def _turn(self, s: Session, request: ChatRequest) -> Turn:
        """The call's prompt tokens and cap, every bound checked; the session is not changed. A first call renders
        the messages, a later one continues the session's tokens with the delta of the messages added since its
        last reply."""
        k = len(s.calls)
        if k >= self.spec.max_turns:
            raise RequestError(400, f"the episode has made its {self.spec.max_turns} calls (env.max_turns)")
        # the first call is the k-th sample of its prompt (vLLM seeds it with seed + k); later ones as episodes' turns
        seed = None if s.seed is None else (sum(s.seed) if k == 0 else turn_seed(*s.seed, k))
        if s.prompt_ids is None:
            first = self._render_first(request)
            left = self.spec.max_tokens
            return Turn(first, first, [], self._cap(request, left), seed)
        n = len(s.history)
        sent = request.messages
        if len(sent) <= n or not all(same_message(a, b) for a, b in zip(sent[:n], s.history)):
            raise RequestError(
                400, "a session's messages must extend its last call's messages and reply unchanged", "messages"
            )
        env_ids = self._render(lambda: self.env_tokens.encode(sent[n:], s.ids[-1] if s.ids else None, s.tools))
        left = self.spec.max_tokens - len(s.ids) - len(env_ids)
        if left <= 0:
            s.finish = "length"  # the episode is cut by its budget, whether or not the agent calls again
            raise RequestError(400, f"the episode's tokens are spent (env.max_episode_tokens={self.spec.max_tokens})")
        return Turn(s.prompt_ids + s.ids + env_ids, None, env_ids, self._cap(request, left), seed)

    def _cap(self, request: ChatRequest, left: int) -> int:
        return min(self.turn_cap, left, request.max_tokens or left)

    def _render_first(self, request: ChatRequest) -> list[int]:
        def render() -> list[int]:
            if not self.spec.use_chat_template:
                return list(self.tokenizer("\n".join(m["content"] for m in request.messages))["input_ids"])
            kwargs = {"tools": request.tools} if request.tools else {}
            text = self.tokenizer.apply_chat_template(
                request.messages, add_generation_prompt=True, tokenize=False, **kwargs
            )
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

        ids = self._render(render)
        limit = self.spec.max_prompt_tokens
        if limit is not None and len(ids) > limit:
            raise RequestError(
                413, f"a first prompt of {len(ids)} tokens; model.max_prompt_tokens={limit} allows fewer", "messages"
            )
        return ids

    @staticmethod
    def _render(render: Callable[[], list[int]]) -> list[int]:
        """Messages as tokens through the chat template. Their types are checked already (agent_http.py), so what
        the template raises on is the messages themselves (roles out of order, a field it requires): the request's
        fault, a 400."""
        try:
            return render()
        except Exception as e:  # noqa: BLE001 - a template's raise_exception and jinja errors alike
            why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise RequestError(
                400, f"the model's chat template cannot render the messages: {why}", "messages"
            ) from None

    def _commit(self, s: Session, request: ChatRequest, turn: Turn, c: Completion, response: dict[str, Any]) -> None:
        """A successful call, added to its session in one step (under its lock)."""
        if turn.first_prompt is not None:
            s.prompt_ids, s.tools, s.n_prompt_messages = turn.first_prompt, request.tools, len(request.messages)
        s.ids += turn.env_ids + c.token_ids
        s.logprobs += [0.0] * len(turn.env_ids) + c.logprobs
        s.mask += [0] * len(turn.env_ids) + [1] * len(c.token_ids)
        s.env_tokens += len(turn.env_ids)
        s.last_text, s.finish = c.text, c.finish_reason
        s.tool_calls += len(response["choices"][0]["message"].get("tool_calls", []))
        s.history = [dict(m) for m in request.messages] + [{"role": "assistant", "content": c.text}]
        s.calls.append(
            {
                "prompt_ids": turn.prompt,
                "completion_ids": c.token_ids,
                "logprobs": c.logprobs,
                "version": self.version,
                "finish_reason": c.finish_reason,
            }
        )
        s.last = (request.messages, response)


def common_prefix(seqs: list[list[int]]) -> list[int]:
    out = seqs[0]
    for s in seqs[1:]:
        k = 0
        while k < min(len(out), len(s)) and out[k] == s[k]:
            k += 1
        out = out[:k]
    return list(out)


def session_completion(s: Session, group_prompt: list[int], reward: Any, failed: bool) -> Completion:
    """A session as a multi-turn completion after the group's shared prompt (tokens of its own first prompt past
    that prefix come first, out of the loss). A reward that is no finite number scores 0, counted (EpisodeInfo)."""
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
    renders the messages an agent adds between calls (rl/rollout/episodes.py EnvTokens). A session takes calls
    until its agent returns (then 410); an agent that raises or runs past `env.episode_timeout_s` scores 0 and its
    episode counts as truncated; an agent that never called the endpoint is an error of its code."""
    from hydra.utils import get_method

    agent = get_method(env.agent) if isinstance(env.agent, str) else env.agent
    batcher = Batcher(generate, sampling)
    endpoint = AgentEndpoint(batcher, env_tokens, spec, env, sampling.max_tokens, version)
    sids = [
        [endpoint.open(None if seeds is None else (seeds[i], k)) for k in range(sampling.n)] for i in range(len(items))
    ]
    pool = ThreadPoolExecutor(max_workers=env.max_concurrent)
    errors: dict[str, BaseException] = {}
    returned = RequestError(410, "the episode is over: its agent has returned its reward")
    timed_out = RequestError(410, f"the episode's time is up (env.episode_timeout_s={env.episode_timeout_s})")

    def closer(session: Session) -> Callable[[Any], None]:  # the session ends when its agent returns
        return lambda _: session.close(returned)

    try:
        futures = []
        for group, item in zip(sids, items):
            for sid in group:
                futures.append(pool.submit(agent, endpoint.base_url, sid, item))
                futures[-1].add_done_callback(closer(endpoint.sessions[sid]))
        deadline = time.monotonic() + env.episode_timeout_s
        results: dict[str, tuple[Any, bool]] = {}
        for sid, fut in zip([sid for g in sids for sid in g], futures):
            try:
                results[sid] = (fut.result(timeout=max(deadline - time.monotonic(), 0.0)), False)
            except FutureTimeout:
                results[sid] = (0.0, True)
            except Exception as e:  # noqa: BLE001 - the agent's own error: its episode scores 0
                errors[sid] = e
                results[sid] = (0.0, True)
    finally:
        for session in endpoint.sessions.values():  # a timed-out agent's next call is refused, so its thread ends
            session.close(timed_out)
        pool.shutdown(wait=False, cancel_futures=True)
        endpoint.close()
        batcher.close()
    if errors:
        first = next(iter(errors.values()))
        log.warning(
            "%d of %d agents raised (their episodes score 0, truncated); the first: %s: %s",
            len(errors),
            len(results),
            type(first).__name__,
            str(first)[:300],
        )
    rollouts = []
    for group in sids:
        sessions = [endpoint.sessions[sid] for sid in group]
        for sid, s in zip(group, sessions):
            if s.prompt_ids is None:
                why = (
                    f"it raised {type(errors[sid]).__name__}: {errors[sid]}" if sid in errors else "it never called it"
                )
                raise RuntimeError(f"env.agent={env.agent} made no call to the endpoint: {why}")
        prompt = common_prefix([s.prompt_ids for s in sessions])
        completions = [session_completion(s, prompt, *results[sid]) for sid, s in zip(group, sessions)]
        rollouts.append(PromptRollout(prompt, completions, version))
    return rollouts
