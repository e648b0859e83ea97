"""Hostile programs against the sandbox (envs/sandbox.py), one group per attack class of docs/sandbox.md:
1 state that outlives a program, 2 acting on other processes, 3 root on the host, 4 limits that do not count
everything, 5 the trainer's packages, 6 clean-up. (Class 7, the trainer side of the reward, is in
test_rewards_code_tests.py.)

Each program is real and runs in the real sandbox; where two layers close a class, a test aims at each layer on its
own (e.g. a pid outside the namespace is not found at all, and a pid inside it is still refused by seccomp), so
removing either layer fails a test. Limits are small to keep the file fast."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from envs.code_tasks import FAMILIES, make_item
from envs.sandbox import SandboxLimits, isolation, run_python
from rewards.code_tests import CodeTestsReward

FAST = SandboxLimits(cpu_s=2, wall_s=20, memory_mb=256, disk_mb=8, max_threads=8, max_output_bytes=16384)
ROOT = os.geteuid() == 0

pytestmark = pytest.mark.skipif(not isolation()["ready"], reason=f"sandbox unavailable: {isolation()['problem']}")


def run(code: str, **limits) -> object:
    return run_python(code, limits=SandboxLimits(**{**FAST.__dict__, **limits}))


def lines(r) -> dict[str, str]:
    """`name: outcome` lines a probe program printed."""
    return dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)


# A probe: try each attack and print `name: ok` when it worked, else the exception's name.
_TRY = """
def attempt(name, fn):
    try:
        fn()
        print(name + ": ok")
    except BaseException as e:
        print(name + ": " + type(e).__name__)
"""

_CTYPES = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sysc(*args):
    if libc.syscall(*args) < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
"""

# ------------------------------------------------------------------------------- 1. state that outlives a program

_LEAVE = (
    _TRY
    + _CTYPES
    + """
secret = SECRET.encode()
def shm():  # SysV shared memory under a fixed key
    shmid = libc.shmget(0x5EED, 4096, 0o1666)
    if shmid < 0:
        raise OSError(ctypes.get_errno(), "shmget")
    libc.shmat.restype = ctypes.c_void_p
    ctypes.memmove(libc.shmat(shmid, None, 0), secret, len(secret))
def key(ring):  # a user key in the session (-3) or user (-4) keyring
    sysc(248, b"user", b"rlft-answers", secret, len(secret), ring)
def mq():
    if libc.mq_open(b"/rlft-answers", os.O_CREAT | os.O_WRONLY, 0o666, None) < 0:
        raise OSError(ctypes.get_errno(), "mq_open")
def tmp_file(path):
    with open(path, "wb") as f:
        f.write(secret)
attempt("shm", shm)
attempt("session_key", lambda: key(-3))
attempt("user_key", lambda: key(-4))
attempt("mqueue", mq)
attempt("tmp", lambda: tmp_file("/tmp/rlft-answers"))
attempt("home", lambda: tmp_file(os.path.expanduser("~/rlft-answers")))
attempt("dev_shm", lambda: tmp_file("/dev/shm/rlft-answers"))
"""
)

_FIND = (
    _TRY
    + _CTYPES
    + """
found = []
def shm():
    shmid = libc.shmget(0x5EED, 0, 0)
    if shmid >= 0:
        libc.shmat.restype = ctypes.c_void_p
        found.append(ctypes.string_at(libc.shmat(shmid, None, 0), 64))
def key(ring):
    libc.syscall.restype = ctypes.c_long
    k = libc.syscall(249, b"user", b"rlft-answers", None, ring)  # request_key
    if k >= 0:
        buf = ctypes.create_string_buffer(256)
        n = libc.syscall(250, 11, k, buf, 256)  # KEYCTL_READ
        found.append(buf.raw[:max(n, 0)])
def tmp_file(path):
    if os.path.exists(path):
        found.append(open(path, "rb").read())
for name, fn in (("shm", shm), ("session_key", lambda: key(-3)), ("user_key", lambda: key(-4)),
                 ("tmp", lambda: tmp_file("/tmp/rlft-answers")), ("home", lambda: tmp_file(os.path.expanduser("~/rlft-answers"))),
                 ("dev_shm", lambda: tmp_file("/dev/shm/rlft-answers"))):
    attempt(name, fn)
print("found:", [f for f in found if SECRET.encode() in f])
"""
)


def test_nothing_one_program_leaves_reaches_the_next():
    secret = f"answers-{uuid.uuid4().hex}"
    left = run(f"SECRET = {secret!r}\n" + _LEAVE)
    assert left.ok, left
    tried = lines(left)
    # the shared kernel objects are refused outright (seccomp); files land in the program's own tmpfs
    assert {tried[k] for k in ("shm", "session_key", "user_key", "mqueue")} == {"PermissionError"}, tried
    assert tried["tmp"] == tried["home"] == "ok" and tried["dev_shm"] == "FileNotFoundError", tried
    later = run(f"SECRET = {secret!r}\n" + _FIND)
    assert later.ok and "found: []" in later.stdout, later
    assert secret not in later.stdout


def test_a_process_a_program_leaves_behind_dies_with_it():
    """The child would print after its parent exits; it is killed with the namespace (PID 1 exits), so nothing
    arrives and the run is not held to its wall limit by a pipe the child keeps open."""
    code = (
        "import os, sys, time\nif os.fork() == 0:\n    try:\n        os.setsid()\n    except OSError:\n        pass\n"
        "    if os.fork() == 0:\n        time.sleep(15)\n        print('late', flush=True)\n    os._exit(0)\n"
        "print('parent done', flush=True)\nos._exit(0)"
    )
    r = run(code, max_procs=4, wall_s=30)
    assert r.stdout == "parent done\n" and not r.timed_out and r.error is None, r


def test_a_solution_that_stores_its_answers_does_not_let_a_later_program_score():
    """The reported attack: a program with the solution leaves the answers somewhere, a later program with none
    reads them. Here the reader looks everywhere the writer wrote and scores 0."""
    fam = next(f for f in FAMILIES if f.name == "rotate_left")
    it = make_item(fam, {"k": 2, "d": 0}, __import__("random").Random(0), 6)
    entry = it["metadata"]["entry_point"]
    store = (
        f"{it['answer']}\n_solve = {entry}\nimport json, os\n_seen = {{}}\n"
        f"def {entry}(*args):\n    out = _solve(*args)\n    _seen[json.dumps(args)] = out\n"
        "    for p in ('/tmp/rlft-answers.json', os.path.expanduser('~/.rlft-answers.json')):\n"
        "        try:\n            open(p, 'w').write(json.dumps(_seen))\n        except OSError:\n            pass\n"
        "    return out\n"
    )
    read = (
        "import json, os\n_seen = {}\n"
        "for p in ('/tmp/rlft-answers.json', os.path.expanduser('~/.rlft-answers.json')):\n"
        "    try:\n        _seen.update(json.load(open(p)))\n    except (OSError, ValueError):\n        pass\n"
        f"def {entry}(*args):\n    return _seen.get(json.dumps(args))\n"
    )
    reward = CodeTestsReward(SandboxLimits(cpu_s=2, wall_s=20, memory_mb=256, workers=1))
    first = reward([f"```python\n{store}```"], answer=[it["answer"]], metadata=[it["metadata"]])
    second = reward([f"```python\n{read}```"], answer=[it["answer"]], metadata=[it["metadata"]])
    assert first == [1.0] and second == [0.0], (first, second, reward.reasons)


# ------------------------------------------------------------------------------------ 2. acting on other processes


@pytest.fixture
def bystander():
    """A process outside the sandbox, like the trainer: the test starts it and stops it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_program_cannot_find_or_change_a_process_outside(bystander):
    before = (resource.prlimit(bystander.pid, resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, bystander.pid))
    code = _TRY + "import os, resource, signal\n"
    for pid in (bystander.pid, os.getpid()):
        code += (
            f"attempt('prlimit_{pid}', lambda: resource.prlimit({pid}, resource.RLIMIT_NOFILE, (1, 1)))\n"
            f"attempt('nice_{pid}', lambda: os.setpriority(os.PRIO_PROCESS, {pid}, 19))\n"
            f"attempt('affinity_{pid}', lambda: os.sched_setaffinity({pid}, {{0}}))\n"
            f"attempt('stop_{pid}', lambda: os.kill({pid}, signal.SIGSTOP))\n"
        )
    code += "print('ids:', os.getpid(), os.getppid())\n"
    r = run(code)
    got = lines(r)
    assert got.pop("ids") == "2 1", r  # PID 2 under its own init: the host's pids are another namespace
    # not found at all (the PID namespace), or refused (seccomp, for the calls it filters)
    assert set(got.values()) <= {"ProcessLookupError", "PermissionError"} and len(got) == 8, got
    assert got[f"affinity_{bystander.pid}"] == got[f"nice_{bystander.pid}"] == "ProcessLookupError", got
    after = (resource.prlimit(bystander.pid, resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, bystander.pid))
    assert after == before and bystander.poll() is None


def test_seccomp_refuses_changing_a_process_inside_its_own_namespace():
    """Its own child is visible to it; prlimit, kill and ptrace on it are still refused (the filter's layer)."""
    code = (
        _TRY
        + _CTYPES
        + "import os, resource, signal, time\nchild = os.fork()\nif child == 0:\n    time.sleep(30)\n    os._exit(0)\n"
        "attempt('prlimit', lambda: resource.prlimit(child, resource.RLIMIT_NOFILE, (1, 1)))\n"
        "attempt('kill', lambda: os.kill(child, signal.SIGKILL))\n"
        "attempt('ptrace', lambda: sysc(101, 16, child, 0, 0))\n"  # PTRACE_ATTACH
        "attempt('own_prlimit', lambda: resource.prlimit(0, resource.RLIMIT_NOFILE, (16, 16)))\n"
    )
    got = lines(run(code, max_procs=2))
    assert got == {"prlimit": "PermissionError", "kill": "PermissionError", "ptrace": "PermissionError",
                   "own_prlimit": "ok"}, got  # fmt: skip


# ------------------------------------------------------------------------------------------- 3. root on the host


def test_host_files_it_can_see_are_read_only_and_the_rest_are_not_there():
    victims = [os.__file__, os.path.join(os.path.dirname(os.__file__), "json", "__init__.py")]
    before = [os.stat(v) for v in victims]
    code = _TRY + "import os\n"
    for i, v in enumerate(victims):
        code += (
            f"attempt('chmod{i}', lambda: os.chmod({v!r}, 0o777))\n"
            f"attempt('utime{i}', lambda: os.utime({v!r}, (0, 0)))\n"
            f"attempt('chown{i}', lambda: os.chown({v!r}, 1000, 1000))\n"
            f"attempt('xattr{i}', lambda: os.setxattr({v!r}, 'user.pwned', b'1'))\n"
            f"attempt('write{i}', lambda: open({v!r}, 'a').write('#'))\n"
        )
    code += (
        "attempt('shadow', lambda: open('/etc/shadow').read())\n"
        "attempt('root_home', lambda: os.listdir('/root/.ssh'))\n"
        "attempt('setuid0', lambda: os.setuid(0))\n"
        "print('uid:', os.getuid(), os.geteuid(), os.getgid())\n"
    )
    got = lines(run(code))
    assert got.pop("uid") == "1000 1000 1000", got
    assert got.pop("shadow") == got.pop("root_home") == "FileNotFoundError", got
    assert got.pop("setuid0") == "PermissionError", got
    assert set(got.values()) <= {"OSError", "PermissionError"} and len(got) == 10, got  # EROFS / EPERM
    assert [(s.st_mode, s.st_mtime_ns, s.st_uid) for s in before] == [
        (s.st_mode, s.st_mtime_ns, s.st_uid) for s in map(os.stat, victims)
    ]


def test_no_nested_namespaces_even_where_processes_are_allowed():
    """A nested user namespace would hand the program every capability there (mounts, more kernel surface)."""
    code = (
        _TRY + _CTYPES + "attempt('unshare', lambda: sysc(272, 0x10000000))\n"  # unshare(CLONE_NEWUSER)
        "def clone_new_user():\n    pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n"  # clone(NEWUSER | SIGCHLD)
        "    if pid == 0:\n        os._exit(0)\n    if pid < 0:\n        raise OSError(ctypes.get_errno(), 'clone')\n"
        "    os.waitpid(pid, 0)\n"
        "attempt('clone', clone_new_user)\n"
        "attempt('fork', lambda: os.waitpid(os.fork() or os._exit(0), 0))\n"
    )
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers of this test are x86_64's")
    got = lines(run(code, max_procs=2))
    assert got == {"unshare": "PermissionError", "clone": "PermissionError", "fork": "ok"}, got


@pytest.mark.skipif(not ROOT, reason="a non-root trainer's programs keep its (non-root) uid")
def test_a_root_trainers_program_is_not_root_on_the_host():
    """RLIMIT_NPROC is not enforced for host uid 0: a thread limit that holds shows the program is not uid 0 on the
    host (test_threads_are_counted shows the same from the limits side)."""
    code = (
        "import threading, time\nthreading.stack_size(65536)\nn = 0\ntry:\n    for _ in range(200):\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n        n += 1\n"
        "except RuntimeError:\n    pass\nprint(n)"
    )
    assert run(code, max_threads=3).stdout == "3\n"


# -------------------------------------------------------------------------- 4. limits that do not count everything


def test_threads_are_counted():
    code = (
        "import threading, time\nthreading.stack_size(65536)\nn = 0\ntry:\n    for _ in range(3000):\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n        n += 1\n"
        "except RuntimeError as e:\n    print(e)\nprint(n)"
    )
    r = run(code)
    assert r.stdout == "can't start new thread\n8\n", r


def test_memory_outside_the_address_space_is_refused_or_bounded():
    code = (
        _TRY
        + _CTYPES
        + """
attempt("memfd", lambda: os.memfd_create("hog"))
attempt("shmget", lambda: sysc(29, 0, 1 << 30, 0o1600))
attempt("msgget", lambda: sysc(68, 0, 0o1600))
pipes = []
def pipe_hog():
    while True:
        pipes.append(os.pipe())
attempt("pipes", pipe_hog)
print("count:", len(pipes))
"""
    )
    got = lines(run(code, max_open_files=32))
    assert got.pop("memfd") == got.pop("shmget") == got.pop("msgget") == "PermissionError", got
    assert got["pipes"] == "OSError" and int(got["count"]) <= 16, got  # two descriptors each, 32 at most


def test_disk_space_counts_reserved_blocks_and_every_file():
    reserve = _CTYPES + (  # FALLOC_FL_KEEP_SIZE: 4 MiB reserved per file, every file's size stays 0
        "for i in range(100):\n    fd = os.open(f'r{i}', os.O_CREAT | os.O_WRONLY)\n"
        "    if libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(4 << 20)):\n"
        "        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
    )
    r = run(reserve)
    assert r.exit_code == 1 and r.error == "disk limit (8 MiB)", r
    many = "for i in range(100):\n    open(f'f{i}', 'wb').write(bytes(1 << 20))\n"  # each file under the 16 MiB cap
    r = run(many)
    assert r.exit_code == 1 and r.error == "disk limit (8 MiB)", r


# ------------------------------------------------------------------------------------ 5. the trainer's packages


def test_third_party_packages_are_not_reachable():
    import site

    import pytest as host_package  # a package the trainer has: it must not be importable in the sandbox

    dirs = [*site.getsitepackages(), os.path.dirname(os.path.dirname(host_package.__file__))]
    dirs += ["/usr/lib/python3/dist-packages", f"/usr/local/lib/python3.{sys.version_info.minor}/dist-packages"]
    dirs += [
        os.path.join(sys.base_prefix, "lib", f"python3.{sys.version_info.minor}", d)
        for d in ("site-packages", "dist-packages")
    ]
    code = (
        _TRY
        + f"import os, sys\nsys.path[:0] = {sorted(set(dirs))!r}\n"
        + "".join(f"attempt({m!r}, lambda: __import__({m!r}))\n" for m in ("pytest", "omegaconf", "yaml", "pip"))
        + "leaks = []\nfor root, subdirs, files in os.walk('/'):\n"
        "    if root.endswith(('-packages', '.dist-info', '.egg-info')) and (subdirs or files):\n"
        "        leaks.append(root)\n    subdirs[:] = [d for d in subdirs if d != 'proc']\n"
        "print('leaks:', leaks)\n"
    )
    got = lines(run(code))
    assert got.pop("leaks") == "[]", got
    assert set(got.values()) == {"ModuleNotFoundError"}, got


# ----------------------------------------------------------------------------------------------- 6. clean-up


def test_an_undeletable_tree_leaves_nothing_on_the_host():
    """A tree `shutil.rmtree` cannot remove (no permissions, deeper than PATH_MAX, a FIFO) lives only in the
    program's tmpfs: the run ends normally and nothing named after it exists on the host afterwards."""
    mark = f"rlft-left-{uuid.uuid4().hex}"
    code = (
        f"import os\nos.mkdir({mark!r})\nos.chdir({mark!r})\nos.mkfifo('fifo')\nopen('f', 'w').write('x')\n"
        "for i in range(120):\n    os.mkdir('d' * 40)\n    os.chdir('d' * 40)\n"  # ~4.9 kB deep, past PATH_MAX
        f"os.chdir('/tmp')\nos.chmod({mark!r}, 0)\nprint('built')\n"
    )
    r = run(code)
    assert r.ok and r.stdout == "built\n", r
    for top in {tempfile.gettempdir(), "/tmp", "/var/tmp", str(Path.home())}:
        assert not list(Path(top).glob(mark)) and not list(Path(top).glob(f"*/{mark}")), top


def test_a_program_killed_at_the_wall_limit_leaves_nothing_either():
    mark = f"rlft-left-{uuid.uuid4().hex}"
    r = run(f"import os, time\nos.mkdir({mark!r})\nos.chmod({mark!r}, 0)\ntime.sleep(60)", wall_s=1)
    assert r.timed_out and r.error == "wall time limit (1 s)"
    assert not list(Path(tempfile.gettempdir()).glob(f"*/{mark}")) and not list(Path("/tmp").glob(f"*/{mark}"))
