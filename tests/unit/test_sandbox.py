"""The sandbox for model-written code (envs/sandbox.py): every limit and every hostile program, each run for real.

Limits are small (wall 2 s) to keep the file fast; a program past a limit is stopped, reported, and never reaches
the test process, its files or its environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from envs.sandbox import SandboxLimits, isolation, run_many, run_python, seccomp_program

FAST = SandboxLimits(cpu_s=1, wall_s=2, memory_mb=256, max_output_bytes=4096)
ROOT = os.geteuid() == 0


def run(code: str, stdin: str = "", **limits) -> object:
    return run_python(code, stdin=stdin, limits=SandboxLimits(**{**FAST.__dict__, **limits}))


def test_machine_gives_every_required_layer_and_reports_what_it_binds():
    info = isolation()
    assert info["ready"] is True and info["problem"] is None
    assert set(info) == {"ready", "problem", "landlock_abi", "binds", "hidden"}
    assert not any(b.startswith(sys.prefix) for b in info["binds"] if sys.prefix != sys.base_prefix)  # no venv


def test_the_launcher_is_a_module_that_runs_only_as_the_main_program():
    """Imported, the launcher does nothing; run as the sandbox runs it but given no program, it stops before any
    namespace with its own exit code and one line."""
    import json

    from envs import sandbox, sandbox_launcher

    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", sandbox._LAUNCHER, json.dumps({})], input=b"", capture_output=True
    )
    assert (proc.returncode, proc.stderr) == (sandbox_launcher.SANDBOX_EXIT, b"sandbox: no program on stdin\n")


def test_runs_a_program_with_stdin_and_reports_its_exit():
    r = run("import sys\nname = input()\nprint('hello', name)\nprint('warn', file=sys.stderr)", stdin="ada\n")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.error) == ("hello ada\n", "warn\n", 0, False, None)
    assert r.ok and r.seconds > 0
    failed = run("raise SystemExit(3)")
    assert failed.exit_code == 3 and failed.error is None and not failed.ok
    crashed = run("1 / 0")
    assert crashed.exit_code == 1 and "ZeroDivisionError" in crashed.stderr


def test_the_standard_library_and_its_extension_modules_work():
    """The binds hold every shared library the interpreter's extension modules need (found by the probe)."""
    modules = "array bisect collections ctypes datetime decimal fractions hashlib heapq itertools json math random re"
    modules += " sqlite3 statistics string struct textwrap unicodedata zlib lzma bz2 ssl"
    r = run(
        f"for m in {modules.split()!r}:\n    __import__(m)\nimport hashlib\nprint(hashlib.sha256(b'').hexdigest()[:8])"
    )
    assert r.ok and r.stdout == "e3b0c442\n", r


def test_a_program_ends_the_way_the_interpreter_would_end_it():
    """The program process leaves through os._exit (see the launcher) after doing what interpreter exit does."""
    r = run(
        "import atexit, sys, threading, time\natexit.register(lambda: print('atexit ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined'))).start()\n"
        "sys.stdout.write('unflushed')\nsys.exit('bye')"
    )
    assert (r.exit_code, r.stdout, r.stderr) == (1, "unflushedthread joined\natexit ran\n", "bye\n"), r
    assert run("import sys\nsys.exit(300)").exit_code == 300 & 0xFF
    assert run("import sys\nsys.exit()").exit_code == 0


def test_large_stdin_is_fed_without_deadlock():
    r = run("import sys\nprint(len(sys.stdin.read()))", stdin="x" * 1_000_000, max_output_bytes=100)
    assert r.stdout == "1000000\n"


def test_wall_time_limit_kills_a_sleeping_program():
    r = run("import time\ntime.sleep(60)")
    assert r.timed_out and r.exit_code is None and r.error == "wall time limit (2 s)"


def test_cpu_time_limit_stops_a_busy_loop():
    # a generous wall limit: on a busy machine one CPU second takes longer than one wall second
    r = run("while True:\n    pass", wall_s=60)
    assert not r.timed_out and r.exit_code == -signal.SIGXCPU and r.error == "cpu time limit (1 s)"


def test_infinite_loop_that_ignores_sigxcpu_is_stopped():
    r = run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass", wall_s=3)
    assert r.error in ("wall time limit (3 s)", "killed by signal 9")  # the hard CPU limit or the wall, first wins


def test_memory_limit_stops_a_memory_hog():
    r = run("hog = []\nwhile True:\n    hog.append(bytearray(1 << 24))")
    assert r.exit_code == 1 and r.error == "memory limit" and "MemoryError" in r.stderr


def test_file_size_limit_stops_a_disk_filler():
    r = run("with open('big', 'wb') as f:\n    while True:\n        f.write(bytes(1 << 20))")
    assert r.exit_code == 1 and r.error == "file size limit (16 MiB)" and "File too large" in r.stderr


def test_output_limit_stops_huge_output_and_keeps_the_cap():
    r = run("while True:\n    print('x' * 10000)")
    assert r.error == "output limit (4096 bytes)" and r.exit_code is None
    assert len(r.stdout) + len(r.stderr) <= 4096


def test_no_child_processes_but_threads_work():
    bomb = run("import os\nwhile True:\n    os.fork()")
    assert bomb.exit_code == 1 and "PermissionError" in bomb.stderr
    sub = run("import subprocess\nsubprocess.run(['true'])")
    assert sub.exit_code == 1 and "PermissionError" in sub.stderr
    threads = run(
        "import threading\nout = []\nts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(out))"
    )
    assert threads.stdout == f"{list(range(8))}\n"


def test_max_procs_above_one_allows_processes_within_the_task_limit():
    r = run(
        "import os\nn = 0\ntry:\n    while n < 100:\n        if os.fork() == 0:\n            import time\n"
        "            time.sleep(5)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)",
        max_procs=4,
        max_threads=2,
        wall_s=5,
    )
    # processes and threads share one budget of max_procs + max_threads tasks: the program plus 5 children
    assert r.ok and r.stdout == "5\n"


def test_fresh_working_directory_is_home_and_a_tmpfs_of_disk_mb():
    r = run(
        "import os\nopen('note.txt', 'w').write('hi')\nst = os.statvfs('.')\n"
        "print(os.getcwd(), os.environ['HOME'], sorted(os.listdir('.')), st.f_blocks * st.f_frsize >> 20)",
        disk_mb=8,
    )
    assert r.stdout == "/tmp /tmp ['main.py', 'note.txt'] 8\n"
    again = run("import os\nprint(sorted(os.listdir('.')))")  # the next program starts from an empty directory
    assert again.stdout == "['main.py']\n"


def test_writing_outside_its_directory_is_denied(tmp_path):
    target = tmp_path / "pwned"
    for path in (target, "/usr/rlft-pwned-test", "../rlft-pwned-test", Path.home() / "rlft-pwned-test", "/dev/pwned"):
        r = run(f"open({str(path)!r}, 'w').write('x')")
        # the host path is not there at all; what is there is read-only
        assert r.exit_code == 1 and any(e in r.stderr for e in ("FileNotFound", "OSError", "Permission")), (path, r)
    assert not target.exists() and not Path("/usr/rlft-pwned-test").exists()


def test_the_repository_proc_and_etc_are_not_there():
    for path in (Path(__file__).resolve(), "/proc/self/environ", "/proc/1/environ", "/etc/shadow", "/etc/passwd"):
        r = run(f"print(open({str(path)!r}).read()[:20])")
        assert r.exit_code == 1 and "FileNotFoundError" in r.stderr, (path, r)


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("RLFT_TEST_SECRET", "hunter2")
    r = run("import os\nprint(sorted(os.environ))")
    assert "RLFT_TEST_SECRET" not in r.stdout and "hunter2" not in r.stdout
    assert r.stdout.strip() == "['HOME', 'LANG', 'PATH', 'TMPDIR']"


def test_reading_the_parents_environment_fails(monkeypatch):
    monkeypatch.setenv("RLFT_TEST_SECRET", "hunter2")
    r = run("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())")
    assert r.exit_code == 1 and "hunter2" not in r.stdout


def test_opening_a_socket_fails():
    r = run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert r.exit_code == 1 and "PermissionError" in r.stderr
    unix = run("import socket\nsocket.socket(socket.AF_UNIX).connect('/var/run/docker.sock')")
    assert unix.exit_code == 1 and "PermissionError" in unix.stderr


def test_killing_its_parent_fails_and_the_parent_survives():
    r = run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert r.exit_code == 1 and "PermissionError" in r.stderr
    # signal 0 only asks whether a signal could be sent: to every process (-1) it must be refused
    everyone = run("import os\nos.kill(-1, 0)")
    assert everyone.exit_code == 1 and "PermissionError" in everyone.stderr
    itself = run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert itself.exit_code == -signal.SIGTERM and itself.error == "killed by signal 15"


def test_no_capabilities_even_for_a_root_trainer():
    r = run("import os\nos.nice(-1)")  # raising its priority needs CAP_SYS_NICE
    assert r.exit_code == 1 and "PermissionError" in r.stderr


def test_run_many_keeps_the_order_and_isolates_a_hostile_neighbour():
    jobs = [(f"print({i})", "") for i in range(6)] + [("while True:\n    pass", "")]
    results = run_many(jobs, FAST, workers=3)
    assert [r.stdout for r in results[:6]] == [f"{i}\n" for i in range(6)]
    assert results[6].error is not None and all(r.ok for r in results[:6])


def test_limits_are_checked_with_the_key_in_the_message():
    with pytest.raises(ValueError, match=r"sandbox.wall_s must be > 0"):
        SandboxLimits(wall_s=0)
    with pytest.raises(ValueError, match=r"sandbox.memory_mb must be > 31"):
        SandboxLimits(memory_mb=16)


def test_seccomp_program_is_whole_instructions():
    prog = seccomp_program(no_processes=True)
    assert prog is not None and len(prog) % 8 == 0 and len(prog) // 8 < 150
    assert len(seccomp_program(no_processes=False)) < len(prog)


_SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(not ROOT or not os.access(_SYSTEM_PYTHON, os.X_OK), reason="needs root and a system python3")
def test_a_non_root_trainer_gets_the_same_sandbox():
    """The unprivileged path (the launcher maps its own uid; its helper writes no root mapping): run as uid 1000
    with the system interpreter (ours may sit in root's home), the program is uid 1000 and PID 2, sees no host
    tree, and its thread limit is exact."""
    probe = (
        "import sys\nsys.path.insert(0, sys.argv[1])\nfrom envs.sandbox import SandboxLimits, isolation, run_python\n"
        "assert isolation()['ready'], isolation()\n"
        'r = run_python(\'import os, threading, time\\nprint(os.getuid(), os.getpid(), sorted(os.listdir("/")))\\n'
        "threading.stack_size(65536)\\nn = 0\\ntry:\\n    for _ in range(50):\\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\\n        n += 1\\n"
        "except RuntimeError:\\n    pass\\nprint(n)', limits=SandboxLimits(max_threads=5))\n"
        "print(r.stdout, end='')\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [_SYSTEM_PYTHON, "-I", "-c", probe, root],
        user=1000, group=1000, extra_groups=[], capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    if "Permission denied" in out.stderr:
        pytest.skip(f"uid 1000 cannot read the repository at {root}")
    assert out.stdout.splitlines() == ["1000 2 ['dev', 'etc', 'tmp', 'usr']", "5"], out


def test_text_that_is_not_valid_unicode_in_code_or_stdin_never_raises():
    r = run("import sys\nprint(repr(sys.stdin.read()))  # \ud800", stdin="a\udcffb\x00")
    assert r.ok and r.stdout == "'a?b\\x00'\n", r
