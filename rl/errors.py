"""Errors whose message alone tells the user what failed and what to do (train.py prints them as one line), and
how a role's failure is caught where it happens: the root cause of a vLLM engine that did not start, read back
from its own output, and a failed constructor's cause as one `Type: message` line.

Why the engine's output is read back: vLLM logs an engine's real error in the engine's processes and raises only
"Engine core initialization failed. See root cause above." in the role's; `VLLMRollout` therefore reads back what
those processes wrote (`OutputMark`: a Ray actor's stdout and stderr are one file, `<run dir>/logs/actor0.log`
(rl/logs.py), which the processes it starts inherit) and raises `EngineStartError` with the root cause.
rl/runtime/placement.py (Ray actors) and rl/app.py (cluster.mode=local) turn a role's failed constructor into
`RoleStartFailed(role, cause)`; rl/app.py asks rl/preflight/diagnose.py for the key that fixes it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator


class UserFacingError(RuntimeError):
    """Printed as one line, no traceback."""


class RunStopped(UserFacingError):
    """The run cannot go on (a learner died, the loss stays non-finite); the message says how to resume."""


class StartupError(UserFacingError):
    """A role or the placement could not start; the message is one line: what, why, and the key that fixes it."""


class EngineStartError(RuntimeError):
    """A vLLM engine did not start; the message is the engine's root cause (`Type: message`), the engine's error
    output follows as a note (it reaches the run's log file with the traceback)."""


class RoleStartFailed(RuntimeError):
    """A role's constructor failed: `role` ("rollout actor 0", "learner 0") and `cause` (one line)."""

    def __init__(self, role: str, cause: str):
        super().__init__(f"{role} failed to start: {cause}")
        self.role, self.cause = role, cause


class OutputMark:
    """Where this process's stdout and stderr end now, to read back what this process and the processes it starts
    (which inherit them) write afterwards. Only regular files can be read back: a Ray actor's stdout and stderr
    are (Ray's worker log files); a terminal or a pipe is skipped."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        for fd in (1, 2):
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            # a role's stdout and stderr are one file in the run's logs/ (rl/logs.py): read it once
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                self.marks.append((fd, st.st_size))

    def read(self, limit: int = 2_000_000) -> str:
        """What was written since the mark (at most the last `limit` bytes of each stream)."""
        out = []
        for fd, start in self.marks:
            try:
                with open(f"/proc/self/fd/{fd}", "rb") as f:
                    f.seek(max(start, os.fstat(f.fileno()).st_size - limit))
                    out.append(f.read().decode(errors="replace"))
            except OSError:
                continue
        return "\n".join(out)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# vLLM's log prefix "(Worker pid=1) ERROR 12-01 05:28:44 [file.py:12] " and Ray's "(VLLMRollout pid=1) "
_PREFIX = re.compile(r"^(?:\([\w.-]+ pid=\d+[^)]*\) )*(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] )?")
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)): (?P<msg>\S.*)$")
_WRAPPERS = ("root cause above", "Worker failed with error", "EngineStartError")


def _clean(line: str) -> str:
    return _PREFIX.sub("", _ANSI.sub("", line)).rstrip()


def engine_root_cause(output: str) -> str | None:
    """The first error of the first traceback in a vLLM engine's output that is not one of vLLM's wrappers
    ("... See root cause above.", "Worker failed with error '...'"), as `Type: message`; None if there is none."""
    seen_traceback = False
    for raw in output.splitlines():
        line = _clean(raw).strip()
        if line.startswith("Traceback (most recent call last)"):
            seen_traceback = True
            continue
        m = _EXC_LINE.match(line)
        if seen_traceback and m and not any(w in line for w in _WRAPPERS):
            return f"{m['type'].rsplit('.', 1)[-1]}: {m['msg']}"
    for raw in output.splitlines():  # vLLM's relay of a worker's error keeps its message (not its type)
        m = re.search(r"Worker failed with error '(.+?)'(?:, please check|$)", _clean(raw))
        if m:
            return m.group(1)
    return None


def engine_error_lines(output: str, limit: int = 120) -> str:
    """The engine's error output (its ERROR log lines and tracebacks), at most `limit` lines, for the run's log."""
    keep, in_tb = [], False
    for raw in output.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        if "Traceback (most recent call last)" in line:
            in_tb = True
        if in_tb or " ERROR " in line:
            keep.append(line)
        if in_tb and _EXC_LINE.match(_clean(line).strip()):
            in_tb = False
    return "\n".join(keep[-limit:])


def engine_start_error(e: BaseException, output: str) -> EngineStartError:
    """The EngineStartError for an engine constructor's exception `e`, with the root cause from the engine's
    `output` when vLLM only says to look above (else `e` is the cause itself, e.g. a bad config.json)."""
    own = _one_line(e)
    root = engine_root_cause(output) if "root cause above" in own or "initialization failed" in own else None
    err = EngineStartError(root or own)
    lines = engine_error_lines(output)
    if lines:
        err.add_note(f"vLLM engine output (errors):\n{lines}")
    return err


def _one_line(e: BaseException) -> str:
    text = shorten(str(e), 400)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _chain(e: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def cause_of(e: BaseException) -> str:
    """What a role's failed constructor raised, as one `Type: message` line. In this process: an EngineStartError
    in the chain, else the exception itself. From a Ray actor (ray.exceptions) only the text of the actor's
    traceback arrives (`cause_from_text`)."""
    for x in _chain(e):
        if isinstance(x, EngineStartError):
            return str(x)
    return cause_from_text(str(e)) if type(e).__module__.startswith("ray.") else _one_line(e)


def cause_from_text(text: str) -> str:
    """The role's error in the text of a traceback (what Ray passes on from an actor): its EngineStartError line,
    else its last `Type: message` line, else the text itself (Ray's words for an actor that died, e.g. of memory)."""
    lines = [_clean(x).strip() for x in text.splitlines()]
    engine = [x for x in lines if re.match(r"^(?:[\w.]+\.)?EngineStartError: ", x)]
    if engine:
        return engine[-1].split("EngineStartError: ", 1)[1]
    found = [m for m in map(_EXC_LINE.match, lines) if m]
    if found:
        return f"{found[-1]['type'].rsplit('.', 1)[-1]}: {found[-1]['msg']}"
    return shorten(_ANSI.sub("", text), 400)


def shorten(text: str, n: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."
