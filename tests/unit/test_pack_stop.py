"""How a sweep pack stops (hydra/launcher=pack, rl/pack.py), without Ray or vLLM: on Ctrl-C or SIGTERM, whose
KeyboardInterrupt reaches the launcher's thread while it waits for the jobs, every job ends with the line that
continues it, and only then are the pack's roles closed. The same stop with real roles is the tier-2 interrupted
sweep of tests/integration/test_packs.py."""

from __future__ import annotations

import signal
import sys
import threading
from types import SimpleNamespace

import pytest

from hydra_plugins.rlft_pack_launcher.pack_launcher import JobLabels, PackLauncher
from rl import pack
from train import interrupted


class RolelessPack(pack.Pack):
    """A Pack with no roles: `start` hands each job an empty runtime; `close` and the launcher's waits once the pack
    was stopped are recorded in `events`, beside what the fake jobs record."""

    def __init__(self, jobs: list[int], log_dir):
        super().__init__(jobs, log_dir)
        self.events: list[str] = []
        self.waited_after_stop = self.closed = False

    def start(self) -> None:
        with self.cond:
            self.runtimes = dict.fromkeys(self.cfgs)
            self.cond.notify_all()

    def wait_ended(self, timeout_s: float | None = None) -> bool:
        if self.stop.is_set():
            with self.cond:
                self.waited_after_stop = True
                self.cond.notify_all()
        return super().wait_ended(timeout_s)

    def close(self) -> None:
        with self.cond:
            self.events.append("close")
            self.closed = True
            self.cond.notify_all()


class FakeJobs(PackLauncher):
    """The pack launcher with fake jobs: each joins the pack and, as train.py's job does, ends at the stop with its
    `interrupted:` line (recorded in the pack's `events`). Job #1 stops the pack: SIGUSR1 to the launcher's thread
    stands in for SIGTERM, whose handler raises KeyboardInterrupt there (rl/entry.py on_sigterm). Job #0 is the
    slowest to end: still running when the launcher would close the pack if it did not wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[threading.Thread] = []

    def run_one(self, p: RolelessPack, i: int, config, returns: dict) -> None:
        self.threads.append(threading.current_thread())
        try:
            p.join(i, config)
            if i == 1:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
            p.stop.wait()  # its next call on the roles raises KeyboardInterrupt
            if i == 0:
                with p.cond:
                    p.cond.wait_for(lambda: p.waited_after_stop or p.closed)
            p.events.append(f"interrupted: #{i}")
            returns[i] = SimpleNamespace(exit_code=130)
        finally:
            p.ended(i)


def test_a_stopped_pack_closes_its_roles_only_once_every_job_has_printed_how_to_continue_it(tmp_path):
    """A Ctrl-C or SIGTERM reaches the launcher's thread while it waits for the jobs (its KeyboardInterrupt raised
    there): the pack stops every job, and closes its roles and exits 130 only after the last one has ended, the slow
    one too (a wait that took the interrupted thread for ended would close the roles under it and lose its line)."""

    def keyboard_interrupt(signum, frame):
        raise KeyboardInterrupt

    launcher, p = FakeJobs(), RolelessPack([0, 1, 2], tmp_path)
    before = signal.signal(signal.SIGUSR1, keyboard_interrupt)
    try:
        with pytest.raises(SystemExit) as stopped:
            launcher.run_pack(p, {i: SimpleNamespace(job=i) for i in (0, 1, 2)})
    finally:
        signal.signal(signal.SIGUSR1, before)
        for t in launcher.threads:
            t.join(timeout=60)
    assert stopped.value.code == 130
    assert sorted(p.events[:-1]) == ["interrupted: #0", "interrupted: #1", "interrupted: #2"]
    assert p.events[-1] == "close"


def test_an_interrupted_jobs_line_reaches_the_console_whole_in_one_labelled_write(tmp_path, monkeypatch):
    """A pack's jobs stop together: each one's `interrupted:` line is one write, so a pack mate's line cannot fall
    between its text and its newline (tests/integration/test_packs.py reads these lines back)."""

    class Recorded:
        def __init__(self):
            self.writes: list[str] = []

        def write(self, s: str) -> int:
            self.writes.append(s)
            return len(s)

        def flush(self) -> None:
            pass

    console = Recorded()
    labelled = JobLabels(console)
    labelled.label("#2")
    monkeypatch.setattr(sys, "stderr", labelled)
    monkeypatch.setattr(sys, "argv", ["train.py", "-m", "run.seed=0,1", "hydra/launcher=pack"])
    with pytest.raises(SystemExit) as stopped:
        interrupted(tmp_path / "2", "/sweeps/a")
    assert stopped.value.code == 130
    command = "python train.py -m run.seed=0,1 hydra/launcher=pack hydra.sweep.dir=/sweeps/a run.resume=auto"
    line = f"#2 | interrupted: {tmp_path / '2'}: it has no checkpoint yet, so it starts again from step 0; continue it"
    assert console.writes == [f"{line} with: {command}\n"]


def test_a_jobs_printed_lines_reach_the_console_whole_however_its_mates_interleave():
    """`print` writes a line's text and its newline in two writes; between them a pack mate's thread may write. Each
    job's lines reach the console whole and labelled, a flushed line start once, and other threads' text unchanged."""
    writes: list[str] = []

    class Console:
        def write(self, s: str) -> int:
            writes.append(s)
            return len(s)

        def flush(self) -> None:
            pass

    labelled = JobLabels(Console())
    second = threading.Event()

    def job(label: str, first: threading.Event, then: threading.Event) -> None:
        labelled.label(label)
        labelled.write(f"step 1 of {label}")
        first.set()
        assert then.wait(30)
        labelled.write("\n")
        labelled.write("two\nlines\nand a st")
        labelled.flush()
        labelled.write("art\n")

    first = threading.Event()
    a = threading.Thread(target=job, args=("#0", first, second))
    a.start()
    first.wait(5)
    go = threading.Event()
    go.set()
    b = threading.Thread(target=job, args=("#1", threading.Event(), go))
    b.start()
    b.join(30)  # job #1 prints whole while job #0's first line waits for its newline
    labelled.write("the launcher's own line\n")
    second.set()
    a.join(30)
    text = "".join(writes)
    assert text.splitlines() == [
        "#1 | step 1 of #1",
        "#1 | two",
        "#1 | lines",
        "#1 | and a start",
        "the launcher's own line",
        "#0 | step 1 of #0",
        "#0 | two",
        "#0 | lines",
        "#0 | and a start",
    ]
    assert all(w.endswith("\n") or w.endswith("and a st") for w in writes)
