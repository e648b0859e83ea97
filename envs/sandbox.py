"""Run model-written Python in a confined child process: the code reward (rewards/code_tests.py) and the Python tool
run every program through `run_python` (threat model, layers and limits: docs/sandbox.md).

Each program gets a launcher process, fresh namespaces and an init. The launcher (trusted code in
envs/sandbox_launcher.py, run as `python -I -S`) reads the program from its stdin, then:
- enters new user, mount, PID, IPC, UTS, network and cgroup namespaces; a short-lived helper forked before that
  maps the program's user: uid 1000 inside, the unprivileged host uid 65534 when the trainer is root (else the
  trainer's own uid, which is not root), so host files only root may read or change stay out of reach;
- builds a new root on a tmpfs: read-only binds of exactly what the interpreter maps (its standard library,
  extension modules and shared libraries, found once by `isolation()`), every site-packages/dist-packages under
  them hidden by an empty read-only tmpfs, /dev/null, /dev/zero, /dev/*random, and the working directory /tmp: a
  tmpfs of `disk_mb` (every file and every reserved block counts), which vanishes with the namespace. Nothing of
  the program stays on the host, so there is nothing to clean up and nothing for a later program to find;
- forks an init, PID 1 of the new PID namespace, that dies with the launcher (PR_SET_PDEATHSIG) and forks the
  program as PID 2; when the program ends the init reports how and exits, and the kernel kills whatever the
  program left in its namespace; the launcher ends the same way the program did;
- in the program process: capabilities dropped, uid 1000, rlimits (CPU, address space, 16 MiB per file, open
  files, and threads + processes as RLIMIT_NPROC, which its own user namespace makes a per-program count),
  `no_new_privs`, Landlock where the kernel has it (writes only in /tmp, TCP, signals and abstract sockets scoped),
  and a seccomp filter (no sockets, no new processes when `max_procs == 1`, no signals or rlimit changes to other
  processes, no keyrings, memfd, SysV/POSIX IPC, mounts or new namespaces, no ptrace, io_uring or
  process_vm_*). Then it runs the program.
Every layer is required: where one is missing nothing runs (fail closed) and the result's error says what is
missing; only Landlock, a second fence behind the read-only mounts, may be absent.

The parent feeds stdin, reads stdout + stderr with a byte cap and kills the launcher's process group at the wall
deadline (the program dies with it: PDEATHSIG, then its namespace). Stdlib only, no preexec_fn (unsafe in the
threaded trainer): the syscalls are made through ctypes in the launcher, after exec.

Past 400 lines because the parent's side of every layer is written out here (the limits and their checks, the
seccomp program, the probe of what the interpreter maps, the bounded output reader), so that with the launcher the
whole threat surface is reviewed in two files.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from envs import sandbox_launcher

# The trusted launcher's source, run as `python -I -S -c _LAUNCHER <cfg>` before any model-written code (a file's
# text, not an import: the launcher runs isolated, without this repository on its path)
_LAUNCHER = Path(sandbox_launcher.__file__).read_text()

log = logging.getLogger(__name__)

PROGRAM_UID = 1000  # the program's uid and gid inside its user namespace
HOST_UID_FOR_ROOT = 65534  # the host uid (nobody) a root trainer's programs run as
FILE_LIMIT_MB = 16  # RLIMIT_FSIZE: the largest single file a program may write


@dataclass
class SandboxLimits:
    """Limits of one program run: the `sandbox` config node (docs/sandbox.md), checked when built."""

    cpu_s: float = 5  # CPU seconds per process: SIGXCPU, then SIGKILL one second later (RLIMIT_CPU)
    wall_s: float = 10  # wall-clock seconds per program; then it and everything it started are killed
    memory_mb: int = 512  # address space per process, MiB (RLIMIT_AS; MemoryError past it)
    disk_mb: int = 64  # its working directory /tmp, MiB: a tmpfs (RAM) where every file and reserved block counts
    max_procs: int = 1  # 1: no child processes (seccomp); above 1: processes allowed, counted with the threads
    max_threads: int = 32  # threads beyond each process's main one, all its processes together (RLIMIT_NPROC)
    max_open_files: int = 64  # file descriptors per process (RLIMIT_NOFILE); also bounds pipe buffers in the kernel
    max_output_bytes: int = 65536  # stdout + stderr together; the program is killed past it and the output cut
    workers: int = 2  # programs run at once when a batch is scored (threads, each waiting on its own process)

    def __post_init__(self) -> None:
        for key, op, bound, fix in (
            ("cpu_s", ">", 0, "a positive number of CPU seconds"),
            ("wall_s", ">", 0, "a positive number of seconds"),
            ("memory_mb", ">", 31, "at least 32 (the interpreter alone needs about 20 MiB)"),
            ("disk_mb", ">", 0, "at least 1 MiB"),
            ("max_procs", ">", 0, "1 (no child processes) or more"),
            ("max_threads", ">=", 0, "0 (one thread per process) or more"),
            ("max_open_files", ">=", 16, "at least 16 (the interpreter opens a few files itself)"),
            ("max_output_bytes", ">", 0, "a positive byte count"),
            ("workers", ">=", 1, "1 or more"),
        ):
            value = getattr(self, key)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not (value > bound if op == ">" else value >= bound):
                raise ValueError(f"sandbox.{key} must be {op} {bound} (got {value!r}): set sandbox.{key} to {fix}")


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when the sandbox killed it (wall time, output); negative: the signal that ended it
    timed_out: bool
    error: str | None  # why it did not finish normally: "wall time limit (10 s)", "memory limit", ...; None if it did
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None


# ---------------------------------------------------------------------------------------------------- seccomp
# Classic BPF over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}.
_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_EPERM, _ENOSYS = 0x00050000 | 1, 0x00050000 | 38
_ARCHES = {  # machine -> (AUDIT_ARCH, syscall numbers)
    "x86_64": (
        0xC000003E,
        dict(
            socket=41, ptrace=101, process_vm_readv=310, process_vm_writev=311, io_uring_setup=425,
            kill=62, tkill=200, tgkill=234, pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438,
            clone=56, clone3=435, fork=57, vfork=58, prlimit64=302, setrlimit=160,
            mount=165, umount2=166, pivot_root=155, chroot=161, unshare=272, setns=308,
            fsopen=430, fsmount=432, open_tree=428, move_mount=429, mount_setattr=442,
            keyctl=250, add_key=248, request_key=249, memfd_create=319, memfd_secret=447,
            shmget=29, shmat=30, msgget=68, semget=64, mq_open=240,
            userfaultfd=323, perf_event_open=298, bpf=321, setsid=112, setpgid=109,
            fanotify_init=300, open_by_handle_at=304, kcmp=312, move_pages=279, migrate_pages=256,
            process_madvise=440, process_mrelease=448,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            socket=198, ptrace=117, process_vm_readv=270, process_vm_writev=271, io_uring_setup=425,
            kill=129, tkill=130, tgkill=131, pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438,
            clone=220, clone3=435, prlimit64=261, setrlimit=164,
            mount=40, umount2=39, pivot_root=41, chroot=51, unshare=97, setns=268,
            fsopen=430, fsmount=432, open_tree=428, move_mount=429, mount_setattr=442,
            keyctl=219, add_key=217, request_key=218, memfd_create=279, memfd_secret=447,
            shmget=194, shmat=196, msgget=186, semget=190, mq_open=180,
            userfaultfd=282, perf_event_open=241, bpf=280, setsid=157, setpgid=154,
            fanotify_init=262, open_by_handle_at=265, kcmp=272, move_pages=239, migrate_pages=238,
            process_madvise=440, process_mrelease=448,
        ),
    ),
}  # fmt: skip

# Refused outright (EPERM), with the class of attack each closes (docs/sandbox.md):
_DENIED = (
    "socket",  # network and Unix sockets (Docker's, Ray's)
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "kcmp", "move_pages", "migrate_pages", "process_madvise", "process_mrelease",  # acting on other processes
    "io_uring_setup",  # a second syscall path that the filter cannot see
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsmount", "open_tree",
    "move_mount", "mount_setattr", "open_by_handle_at", "fanotify_init",  # reshaping or escaping its namespaces
    "keyctl", "add_key", "request_key",  # kernel keyrings: shared with the trainer's session, not namespaced
    "memfd_create", "memfd_secret", "shmget", "shmat", "msgget", "semget", "mq_open",  # memory outside RLIMIT_AS
    "userfaultfd", "perf_event_open", "bpf",  # kernel attack surface no program needs
    "setsid", "setpgid",  # leaving the process group the wall limit kills
)  # fmt: skip


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return code.to_bytes(2, sys.byteorder) + bytes([jt, jf]) + (k & 0xFFFFFFFF).to_bytes(4, sys.byteorder)


_CLONE_NEW = 0x7E020080  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
PID_MARK = 0x7A7A7A7A  # replaced by the launcher with the program's own pid (the one process it may act on)


def seccomp_program(no_processes: bool) -> bytes | None:
    """The filter as bytes for this machine (None: an architecture we have no syscall table for).

    Denied with EPERM: everything in `_DENIED`; kill/tkill/tgkill and prlimit64 unless aimed at the process itself
    (its pid, which the launcher writes over PID_MARK, or 0); clone with any CLONE_NEW* flag; with `no_processes`
    also fork/vfork and clone without CLONE_THREAD. clone3 gets ENOSYS (the C library falls back to clone).
    Another architecture (e.g. 32-bit calls on x86_64) kills the process."""
    import platform

    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit, nr = arch
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    lo0 = 16 if sys.byteorder == "little" else 20  # low 32 bits of args[0]
    out = [_ins(ld, 4), _ins(jeq, audit, 1, 0), _ins(ret, _KILL), _ins(ld, 0)]
    out.append(_ins(0x35, 0x40000000, 0, 1))  # jge: x32 syscalls
    out.append(_ins(ret, _EPERM))
    denied = list(_DENIED)
    if no_processes:
        denied += [n for n in ("fork", "vfork") if n in nr]
    for name in denied:
        out += [_ins(jeq, nr[name], 0, 1), _ins(ret, _EPERM)]
    # clone3 passes its flags in memory the filter cannot read: ENOSYS, so the C library falls back to clone
    out += [_ins(jeq, nr["clone3"], 0, 1), _ins(ret, _ENOSYS)]
    # clone: never with a new namespace (a nested user namespace would give it capabilities there); with
    # `no_processes` only for threads
    refuse_namespaces = [_ins(ld, lo0), _ins(jset, _CLONE_NEW, 0, 1), _ins(ret, _EPERM)]
    if no_processes:
        block = [*refuse_namespaces, _ins(jset, 0x00010000, 1, 0), _ins(ret, _EPERM), _ins(ret, _ALLOW)]
    else:
        block = [*refuse_namespaces, _ins(ret, _ALLOW)]
    out += [_ins(jeq, nr["clone"], 0, len(block)), *block]
    for name in ("kill", "tkill", "tgkill", "prlimit64"):
        # only itself: its pid (in the namespace it sees) or 0 (kill: its process group; prlimit64: itself)
        out += [_ins(jeq, nr[name], 0, 5), _ins(ld, lo0), _ins(jeq, PID_MARK, 2, 0)]
        out += [_ins(jeq, 0, 1, 0), _ins(ret, _EPERM), _ins(ret, _ALLOW)]
    out.append(_ins(ret, _ALLOW))
    return b"".join(out)


# ---------------------------------------------------------------------------------------------- isolation

# Run once, unconfined (trusted code): import every extension module of the standard library and report the
# directories of every file the interpreter then maps (its shared libraries), and its standard library's paths.
_PROBE = r"""
import json, os, sys, importlib
dynload = [p for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p)]
for d in dynload:
    for name in sorted(os.listdir(d)):
        if name.startswith(("_test", "xx", "_xx", "_ctypes_test")):  # CPython's own test modules: not needed
            continue
        try:
            importlib.import_module(name.split(".")[0])
        except BaseException:
            pass
maps = {line.split(None, 5)[5].strip() for line in open("/proc/self/maps") if len(line.split(None, 5)) == 6}
print(json.dumps({"mapped": sorted(m for m in maps if m.startswith("/")), "path": sys.path,
                  "exe": os.path.realpath(sys.executable)}))
"""


def _cover(paths: Sequence[str]) -> list[str]:
    """The fewest directories of `paths` that hold all of them (one that lies under another is dropped)."""
    out: list[str] = []
    for p in sorted(set(paths)):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


@functools.cache
def _layout() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(read-only binds, hidden directories): what the interpreter needs, and the package directories under it."""
    probe = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _PROBE], capture_output=True, text=True, timeout=120, env=_env("/")
    )
    found = json.loads(probe.stdout.strip().splitlines()[-1])  # the last line: a module may print on import
    exe_dir = os.path.dirname(found["exe"])
    dirs = {os.path.dirname(m) for m in found["mapped"] if os.path.isfile(m)} - {exe_dir}
    dirs |= {os.path.realpath(p) for p in found["path"] if os.path.isdir(p)}
    binds = _cover(sorted(d for d in dirs if d not in ("/", "")))
    hide = []
    for root in binds:
        for sub in ("", *sorted(os.listdir(root))):
            base = os.path.join(root, sub)
            if sub and not (sub.startswith("python") and os.path.isdir(base)):
                continue
            hide += [
                os.path.join(base, d)
                for d in ("site-packages", "dist-packages")
                if os.path.isdir(os.path.join(base, d))
            ]
    return tuple(binds), tuple(sorted(set(hide)))


@functools.cache
def isolation() -> dict[str, object]:
    """What this machine gives the sandbox, probed once: {ready, problem, landlock_abi, binds, hidden}.

    `ready` is whether a program can run with every required layer (namespaces, id maps, mounts, seccomp);
    `problem` is the launcher's one line when it cannot."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = int(libc.syscall(444, None, 0, 1)) if sys.platform == "linux" else -1
    info: dict[str, object] = {"ready": False, "problem": None, "landlock_abi": max(abi, 0)}
    if seccomp_program(True) is None:
        info["problem"] = "sandbox: no seccomp syscall table for this CPU (x86_64 and aarch64 are known)"
    else:
        try:
            info["binds"], info["hidden"] = _layout()
        except (OSError, ValueError, KeyError, IndexError, subprocess.SubprocessError) as e:
            info["problem"] = f"sandbox: could not list what the interpreter needs: {e}"
        else:
            r = _launch("print('ok')", "", SandboxLimits(wall_s=60), info)
            if r.stdout != "ok\n":
                info["problem"] = r.error or (r.stderr.strip().splitlines() or ["sandbox: the test program failed"])[-1]
    info["ready"] = info["problem"] is None
    log.info(
        "sandbox: %s; Landlock ABI %s",
        "ready (user, mount, pid, ipc, uts, net namespaces; seccomp)" if info["ready"] else info["problem"],
        info["landlock_abi"] or "none (the read-only mounts alone fence writes)",
    )
    return info


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}


# ---------------------------------------------------------------------------------------------------- run


def run_python(code: str, *, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as a program with `stdin`, under `limits` (None: the defaults); never raises for anything the
    program does."""
    limits = limits or SandboxLimits()
    info = isolation()
    if not info["ready"]:
        return SandboxResult("", "", None, False, f"sandbox unavailable: {info['problem']}", 0.0)
    return _launch(code, stdin, limits, info)


def _launch(code: str, stdin: str, limits: SandboxLimits, info: dict[str, object]) -> SandboxResult:
    start = time.monotonic()
    root = os.geteuid() == 0
    cfg = {
        "uid": PROGRAM_UID,
        "root_maps_to": HOST_UID_FOR_ROOT,
        "binds": list(info["binds"]),
        "hide": list(info["hidden"]),
        "disk_mb": limits.disk_mb,
        "inodes": 4096,
        "file_mb": FILE_LIMIT_MB,
        "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_s,
        "max_open_files": limits.max_open_files,
        # RLIMIT_NPROC counts every task of the uid in the program's own user namespace; a non-root trainer's
        # launcher and init share that uid (a root trainer's are uid 0 there) and count too
        "tasks": limits.max_procs + limits.max_threads + (0 if root else 2),
        "landlock": bool(info["landlock_abi"]),
        "pivot_root": _ARCHES[_machine()][1]["pivot_root"],
        "seccomp": seccomp_program(no_processes=limits.max_procs == 1).hex(),
        "pid_mark": PID_MARK.to_bytes(4, sys.byteorder).hex(),
    }
    source = code.encode("utf-8", errors="replace")
    data = b"%d\n" % len(source) + source + stdin.encode("utf-8", errors="replace")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            env=_env("/tmp"),
            start_new_session=True,  # its own process group: killed as a whole, never our signals
        )
    except OSError as e:
        return SandboxResult("", "", None, False, f"sandbox could not start: {e}", time.monotonic() - start)
    try:
        out, err, stop = _communicate(proc, data, start + limits.wall_s, limits.max_output_bytes)
    finally:
        _kill_group(proc)
    seconds = time.monotonic() - start
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    if stop == "wall":
        return SandboxResult(stdout, stderr, None, True, f"wall time limit ({limits.wall_s:g} s)", seconds)
    if stop == "output":
        return SandboxResult(stdout, stderr, None, False, f"output limit ({limits.max_output_bytes} bytes)", seconds)
    return SandboxResult(stdout, stderr, proc.returncode, False, _error(proc.returncode, stderr, limits), seconds)


def _machine() -> str:
    import platform

    return platform.machine()


def run_many(
    jobs: Sequence[tuple[str, str]], limits: SandboxLimits | None = None, workers: int | None = None
) -> list[SandboxResult]:
    """`run_python(code, stdin=stdin)` for each (code, stdin), `workers` (default `limits.workers`) at a time
    (threads, each waiting on its own launcher process), in the order given."""
    limits = limits or SandboxLimits()
    workers = limits.workers if workers is None else workers
    if workers <= 1 or len(jobs) <= 1:
        return [run_python(c, stdin=s, limits=limits) for c, s in jobs]
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run_python(job[0], stdin=job[1], limits=limits), jobs))


def _error(returncode: int, stderr: str, limits: SandboxLimits) -> str | None:
    tail = stderr[-2000:]
    if returncode == sandbox_launcher.SANDBOX_EXIT and stderr.startswith("sandbox: "):
        return stderr.splitlines()[0]
    if returncode == -signal.SIGXCPU:
        return f"cpu time limit ({limits.cpu_s:g} s)"
    if returncode == -signal.SIGXFSZ:
        return f"file size limit ({FILE_LIMIT_MB} MiB)"
    if returncode < 0:
        return f"killed by signal {-returncode}"
    if returncode == 0:
        return None
    if "MemoryError" in tail:
        return "memory limit"
    if "File too large" in tail:  # Python ignores SIGXFSZ: the write fails (EFBIG)
        return f"file size limit ({FILE_LIMIT_MB} MiB)"
    if "No space left on device" in tail or "Disk quota exceeded" in tail:
        return f"disk limit ({limits.disk_mb} MiB)"
    if "can't start new thread" in tail:
        return f"thread limit ({limits.max_threads})"
    if "Too many open files" in tail:
        return f"open files limit ({limits.max_open_files})"
    return None


def _communicate(proc: subprocess.Popen, data: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Feed stdin, read stdout/stderr until both close and the process exits; stop early at the deadline ("wall")
    or past `cap` bytes of output ("output")."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for f in bufs:
        sel.register(f, selectors.EVENT_READ)
    sent = 0
    if data:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    total, stop = 0, None
    try:
        while sel.get_map() and stop is None:
            left = deadline - time.monotonic()
            if left <= 0:
                stop = "wall"
                break
            for key, _ in sel.select(left):
                if key.fileobj is proc.stdin:
                    try:
                        sent += os.write(proc.stdin.fileno(), data[sent : sent + 65536])
                    except (BrokenPipeError, OSError):
                        sent = len(data)
                    if sent >= len(data):
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[key.fileobj] += chunk
                total += len(chunk)
                if total > cap:
                    stop = "output"
                    break
        if stop is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop = "wall"
    finally:
        sel.close()
    out, err = bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr])
    if stop == "output":  # keep what fits, stdout first
        out = out[:cap]
        err = err[: max(0, cap - len(out))]
    return out, err, stop


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the program's whole process group (it is a session leader) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for f in (proc.stdin, proc.stdout, proc.stderr):
        try:
            f.close()
        except OSError:
            pass
    proc.wait()
