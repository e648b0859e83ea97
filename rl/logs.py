"""Where each process's log lines go, and which reach the console.

Every role (rollout actor, learner) writes its whole output, vLLM's and Ray's included, to its own file in the run
directory, `<run dir>/logs/actor0.log`, `learner0.log`, ...; the driver's log records go to `logs/driver.log`.
The console shows the run's own lines (start-up, steps, evaluations, one-line errors) and, once the roles are
running, the roles' warnings and errors, each prefixed with its role (`[actor0] WARNING ...`), without colour codes.
The roles' start-up chatter (vLLM's configuration, Ray's notices) stays in the files; a role that fails to start
ends the run with one line (rl/preflight/diagnose.py). `run.verbose=true` shows every line of every role as it comes.

- A role's process redirects its stdout and stderr (file descriptors 1 and 2, so the vLLM engine processes it
  starts write there too) when rl/__init__.py sees `RLFT_LOG_FILE` in its environment (rl/runtime/placement.py sets it
  per role). rl/errors.py's OutputMark reads a failed engine's output back from that file.
- The driver follows the files (`LogFollower`, a thread) and prints the lines it selects. On a cluster the files
  are written on each role's node: the driver sees those of other nodes only where the run directory is shared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

LOG_FILE_ENV = "RLFT_LOG_FILE"
DRIVER_LOG = "driver.log"

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# a log line at INFO/DEBUG level: vLLM's "(EngineCore pid=1) INFO 12-01 ...", Python logging's "INFO:name:..."
_QUIET_LEVEL = re.compile(r"^(?:\([^)]*\) )*(?:INFO|DEBUG)\b")
# a warning or an error: a logging level, a Python warning or exception line, a C++ glog/c10 W/E line
_SHOWN = re.compile(
    r"\b(?:WARNING|ERROR|CRITICAL|FATAL)\b|\b\w*(?:Warning|Error|Exception)\b: |^\[[WEF]\d{4} |^Traceback \(most recent"
)
_TRACEBACK_END = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Warning)\b")


def role_log_name(role: str, index: int) -> str:
    """`actor0`, `learner1`: the role's log file stem and its console prefix."""
    return f"{role}{index}"


def role_log_env(log_dir: Path, role: str, index: int) -> dict[str, str]:
    """The environment entry that sends a role process's output to `<log_dir>/<role><index>.log`."""
    return {LOG_FILE_ENV: str(Path(log_dir).resolve() / f"{role_log_name(role, index)}.log")}


def redirect_output(path: str) -> None:
    """Send this process's stdout and stderr (the file descriptors: child processes inherit them) to `path`,
    appended (a restarted role continues its file), line by line."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream, target in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            stream.flush()
        except (AttributeError, ValueError):
            pass
        os.dup2(fd, target)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)


@contextlib.contextmanager
def output_to(path: Path | None) -> Iterator[None]:
    """Inside: this process's stdout and stderr (file descriptors 1 and 2) go to `path`, appended, as a role's do;
    the processes started inside (a vLLM engine's) keep writing there after. None: left as they are (verbose)."""
    if path is None:
        yield
        return
    saved = (os.dup(1), os.dup(2))
    try:
        redirect_output(str(path))
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for fd, target in zip(saved, (1, 2)):
            os.dup2(fd, target)
            os.close(fd)


def setup_driver(log_dir: Path, verbose: bool, this_thread: bool = False) -> logging.Handler | None:
    """The driver's log records (every logger, INFO and up) into `<log_dir>/driver.log`; the console handlers
    (Hydra's) show warnings and errors only, unless `verbose`. `this_thread`: only the records of the calling thread
    (a pack's own file, beside its jobs' files; a job of a pack, in a thread of its own, always). The handler it
    added (None: the file had one)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    path = str((log_dir / DRIVER_LOG).resolve())
    handler = None
    if not any(isinstance(h, logging.FileHandler) and h.baseFilename == path for h in root.handlers):
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        handler.setLevel(logging.INFO)
        if this_thread or threading.current_thread() is not threading.main_thread():
            # a job of a pack runs in a thread of its own (rl/pack.py): its file takes that thread's records only
            me = threading.get_ident()
            handler.addFilter(lambda record: record.thread == me)
        root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    quiet_console(root, verbose)
    return handler


def quiet_console(logger: logging.Logger, verbose: bool) -> None:
    """Raise the console handlers of `logger` to WARNING (unless `verbose`); a logger that does not propagate to
    the root (Ray's) also gets the root's log files."""
    for h in logger.handlers:
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) and not verbose:
            h.setLevel(logging.WARNING)
    if logger is not logging.getLogger() and not logger.propagate:
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.FileHandler) and h not in logger.handlers:
                logger.addHandler(h)


def shown(line: str, verbose: bool) -> bool:
    """Whether a role's log line reaches the console (ANSI codes already removed)."""
    if verbose:
        return True
    return bool(line.strip()) and not _QUIET_LEVEL.match(line) and bool(_SHOWN.search(line))


class LogFollower:
    """Follows the role log files in a folder from where they end when `start` is called, and prints the lines
    `shown` selects to stderr as `[actor0] <line>` (tracebacks whole). `stop` prints what is left and ends."""

    def __init__(self, log_dir: Path, verbose: bool, interval_s: float = 0.5, out=None):
        self.log_dir, self.verbose, self.interval_s = Path(log_dir), verbose, interval_s
        self.out = out if out is not None else sys.stderr
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}
        self._in_traceback: dict[Path, bool] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _files(self) -> list[Path]:
        if not self.log_dir.is_dir():
            return []
        return sorted(p for p in self.log_dir.glob("*.log") if p.name != DRIVER_LOG)

    def start(self) -> LogFollower:
        for p in self._files():  # what is there already (start-up output, an earlier run's) is not shown
            self._offsets[p] = p.stat().st_size
        self._thread = threading.Thread(target=self._run, name="rlft-log-follower", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        for p in self._files():
            try:
                with p.open("rb") as f:
                    f.seek(self._offsets.get(p, 0))
                    data = f.read()
                    self._offsets[p] = f.tell()
            except OSError:
                continue
            if data:
                self._lines(p, data.decode(errors="replace"))

    def _lines(self, path: Path, text: str) -> None:
        text = self._partial.pop(path, "") + text
        lines = text.split("\n")
        if lines[-1]:
            self._partial[path] = lines[-1]
        prefix = f"[{path.stem}] "
        for raw in lines[:-1]:
            line = ANSI.sub("", raw).rstrip("\r")
            in_tb = self._in_traceback.get(path, False)
            if "Traceback (most recent call last)" in line:
                in_tb = True
            if in_tb or shown(line, self.verbose):
                print(prefix + line, file=self.out, flush=True)
            if in_tb and _TRACEBACK_END.match(line.split(") ", 1)[-1].strip()):
                in_tb = False
            self._in_traceback[path] = in_tb

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll()
        self._thread = None
