"""The agent endpoint's HTTP side (rl/rollout/agents.py holds the sessions behind it).

Everything a request carries is read and checked here, before any session or engine work: the headers (a
`Content-Length` that is a byte count within `env.max_request_bytes`), the body (UTF-8, standard JSON within
envs/tool_calls.py `load_json`'s bounds, an object), and each field the endpoint reads (types, ranges, messages as
the chat template takes them: OpenAI's text "parts" are joined into one string). So the session logic only ever sees
a well-formed `ChatRequest`, and every refusal, the server's own included (a bad request line, headers too long, an
unknown method), is a JSON answer `{"error": {"message", "type", "param", "code"}}` whose message names the field.
Refusals carry `x-should-retry: false`: the openai client would otherwise retry some of them (408, 409), and a retry
of a refused request is refused again. The server's listen backlog is sized for every agent calling at once.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from envs.tool_calls import load_json

log = logging.getLogger(__name__)
SESSION_HEADER = "X-Session-ID"
ROLES = ("system", "user", "assistant", "tool")
# the agents' calls are answered one at a time per session: a connection that sends nothing for this long is closed
IDLE_CONNECTION_S = 60.0


class RequestError(Exception):
    """A request the endpoint refuses: its HTTP status, the message the client reads and the field it names."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def error_payload(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True)
class ChatRequest:
    """The fields of a chat completion request the endpoint uses, checked (the others are ignored: the run's
    sampling is the behaviour policy, not the request's)."""

    messages: list[dict[str, Any]]  # each {"role", "content": str} and, as sent, "name", "tool_call_id", "tool_calls"
    tools: list[dict[str, Any]] | None
    max_tokens: int | None  # max_completion_tokens, else max_tokens: may only lower the run's cap
    user: str | None  # the session id, where the X-Session-ID header is not sent


def parse_request(raw: bytes) -> ChatRequest:
    """The request in `raw` (a POST body), or RequestError(400) naming what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the body is not UTF-8 (byte {e.start})") from None
    try:
        body = load_json(text)
    except ValueError as e:
        raise RequestError(400, f"the body is {e}") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be a JSON object (got {_kind(body)})")
    if _field(body, "n", int) not in (None, 1):
        raise RequestError(400, f"n must be 1 (got {body['n']}): each call is one sample of its session", "n")
    if _field(body, "stream", bool):
        raise RequestError(400, "stream must be false: streaming is not offered", "stream")
    max_tokens = None
    for key in ("max_tokens", "max_completion_tokens"):  # the newer name wins where both are given
        value = _field(body, key, int)
        if value is not None and value < 1:
            raise RequestError(400, f"{key} must be at least 1 (got {value})", key)
        max_tokens = value if value is not None else max_tokens
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, f"messages must be a non-empty array (got {_kind(messages)})", "messages")
    tools = _field(body, "tools", list)
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict) or not isinstance(t.get("function"), dict) or not _text(t["function"].get("name")):
            raise RequestError(400, f'tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}', "tools")
    return ChatRequest(
        [_message(i, m) for i, m in enumerate(messages)], tools or None, max_tokens, _field(body, "user", str)
    )


def read_body(headers: Any, rfile: Any, max_bytes: int) -> bytes:
    """A POST's body, read only once its `Content-Length` is known to be within `max_bytes` (env.max_request_bytes)."""
    if headers.get("Transfer-Encoding"):
        raise RequestError(411, "send the body with a Content-Length header (chunked bodies are not read)")
    length = headers.get("Content-Length")
    if length is None:
        raise RequestError(411, "a POST needs a Content-Length header")
    if not re.fullmatch(r"[0-9]{1,18}", length.strip()):
        raise RequestError(400, f"Content-Length must be a byte count (got {length[:40]!r})")
    size = int(length)
    if size > max_bytes:
        raise RequestError(413, f"a request of {size} bytes; env.max_request_bytes={max_bytes} allows fewer")
    raw = rfile.read(size)
    if len(raw) < size:
        raise RequestError(400, f"the body ended after {len(raw)} of its {size} bytes")
    return raw


# respond(method, path, session id header, body) -> (status, payload): the endpoint's answer to one request
Respond = Callable[[str, str, "str | None", bytes], "tuple[int, dict[str, Any]]"]


class AgentServer(ThreadingHTTPServer):
    """A threaded HTTP server whose listen backlog holds `backlog` connections (the standard library's holds 5:
    more agents calling at once than that were reset), each answered by `respond`."""

    daemon_threads = True

    def __init__(self, host: str, backlog: int, max_bytes: int, respond: Respond):
        self.request_queue_size, self.max_bytes, self.respond = backlog, max_bytes, respond
        super().__init__((host, 0), _Handler)
        cap = _somaxconn()
        if cap is not None and backlog > cap:  # the kernel silently lowers a larger backlog to its cap
            log.warning(
                "env.max_concurrent=%d is above this machine's listen backlog cap (net.core.somaxconn=%d): more "
                "agents than that calling at once may be reset; raise the sysctl or lower env.max_concurrent",
                backlog,
                cap,
            )


class _Handler(BaseHTTPRequestHandler):
    server: AgentServer
    timeout = IDLE_CONNECTION_S

    def log_message(self, *args: Any) -> None:  # the actor's log is for errors, not one line per call
        pass

    def _answer(self) -> None:
        try:
            raw = b""
            if self.command == "POST":
                raw = read_body(self.headers, self.rfile, self.server.max_bytes)
            status, payload = self.server.respond(self.command, self.path, self.headers.get(SESSION_HEADER), raw)
        except RequestError as e:
            status, payload = e.status, error_payload(e.status, str(e), e.param)
        except OSError:  # the client went away or stalled past IDLE_CONNECTION_S: nobody to answer
            self.close_connection = True
            return
        except Exception as e:  # noqa: BLE001 - the engine's failure (a session changes only when a call succeeds)
            log.exception("agent endpoint: %s %s failed", self.command, self.path)
            why = f"the call failed ({type(e).__name__}; the actor's log has why); its session is unchanged, so a retry is safe"
            status, payload = 500, error_payload(500, why)
        self._send(status, payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _answer

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The server's own refusals (a malformed request line, headers too long, a method it has no handler
        for) as JSON too, never its HTML page."""
        self.close_connection = True
        self._send(code, error_payload(code, message or self.responses.get(code, ("error",))[0]))

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 405:
            self.send_header("Allow", "GET, POST")
        if 400 <= status < 500:
            self.send_header("x-should-retry", "false")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _somaxconn() -> int | None:
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):  # not Linux
        return None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _field(body: dict[str, Any], key: str, typ: type) -> Any:
    """`body[key]` if it is of type `typ` (a bool is no int here), None if absent or null, else RequestError."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise RequestError(400, f"{key} must be {_kind(typ())} (got {_kind(value)})", key)
    return value


def _message(i: int, m: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise RequestError(400, f"{where} must be an object (got {_kind(m)})", "messages")
    role = m.get("role")
    if role not in ROLES:
        raise RequestError(400, f"{where}.role must be one of {', '.join(ROLES)} (got {str(role)[:40]!r})", "messages")
    out: dict[str, Any] = {"role": role, "content": _content(where, m.get("content"))}
    for key in ("name", "tool_call_id"):
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                raise RequestError(400, f"{where}.{key} must be a string (got {_kind(m[key])})", "messages")
            out[key] = m[key]
    if m.get("tool_calls") is not None:
        calls = m["tool_calls"]
        if role != "assistant" or not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise RequestError(
                400, f"{where}.tool_calls must be an array of objects, on an assistant message", "messages"
            )
        out["tool_calls"] = calls
    return out


def _content(where: str, content: Any) -> str:
    """A message's content as the chat template takes it: a string; OpenAI's text parts are joined by newlines."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(
            400, f"{where}.content must be a string or an array of text parts (got {_kind(content)})", "messages"
        )
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else _kind(part)
            raise RequestError(
                400,
                f'{where}.content[{k}] must be a text part {{"type": "text", "text": ...}} (got {str(kind)[:40]!r})',
                "messages",
            )
        texts.append(part["text"])
    return "\n".join(texts)
