"""Run model-written Python in a confined child process: the code reward (rewards/code_tests.py) and the Python tool
run every program through `run_python` (threat model and limits: docs/sandbox.md).

One program, one process, one fresh temporary working directory (deleted afterwards). Layers, each checked here:
- rlimits (CPU time, address space, 16 MiB per written file, no core files), a wall-clock deadline after
  which the whole process group is killed, stdout + stderr read with a byte cap (the child is killed past it), stdin fed by us;
- a scrubbed environment (PATH, LANG, HOME and TMPDIR = the working directory; nothing of the trainer's) and
  `python -I -S` (no PYTHON* variables, no site-packages: the standard library only);
- a seccomp filter (installed by the trusted launcher before the program runs, kept across exec): no sockets,
  no new processes when `max_procs == 1` (threads are allowed), no signals to other processes, no ptrace,
  io_uring or process_vm_*; the seccomp filter is required: without it nothing runs (fail closed);
- no capabilities (effective, permitted, ambient and bounding sets emptied: a root trainer's child is not
  privileged);
- Landlock where the kernel has it: writes only inside the working directory, reads only the Python install,
  /usr, /lib*, /bin, /etc and /dev/null, /dev/zero, /dev/*random (not /proc, other devices, the repository or
  home directories), TCP connect/bind denied and signals scoped to the sandbox;
- a user + network namespace (`unshare --user --net`) where that works: no network interface at all, and no
  capability in the host's namespaces even when the trainer runs as root.

The launcher is passed with `-c` and the program is a file in the working directory, so no shell is involved.
Stdlib only: the PyPI Landlock binding is a pre-release with filesystem rules only, and seccomp bindings need
libseccomp; the few syscalls are called through ctypes in the launcher (after exec, never in a preexec_fn, which
is unsafe in the threaded trainer).

Past 400 lines because every confinement layer above is written out here (the launcher's Landlock rules, the seccomp
program, the bounded output reader), so that the whole threat surface is reviewed in one file.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)

SANDBOX_EXIT = 71  # the launcher could not confine the program (EX_OSERR): nothing of it ran
_READ_ROOTS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc")  # + /dev/null, /dev/zero, /dev/*random


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one program run (config: `sandbox.*`, rl/config.py).

    cpu_s: CPU seconds (SIGXCPU, then SIGKILL one second later); wall_s: wall-clock seconds before the process
    group is killed; memory_mb: address space (RLIMIT_AS; each file it writes is capped at 16 MiB); max_procs: 1 forbids
    new processes (threads are allowed, bounded by memory_mb), above 1 is RLIMIT_NPROC (Linux does not enforce it
    for uid 0); max_output_bytes: stdout + stderr together.
    """

    cpu_s: float = 5
    wall_s: float = 10
    memory_mb: int = 512
    max_procs: int = 1
    max_output_bytes: int = 65536

    def __post_init__(self) -> None:
        for key, value, low in (
            ("cpu_s", self.cpu_s, 0),
            ("wall_s", self.wall_s, 0),
            ("memory_mb", self.memory_mb, 31),
            ("max_procs", self.max_procs, 0),
            ("max_output_bytes", self.max_output_bytes, 0),
        ):
            if not value > low:
                raise ValueError(f"sandbox.{key} must be > {low} (got {value})")


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


# The trusted launcher: confine, then run main.py. It runs inside the child before any model-written code.
_LAUNCHER = r"""
import ctypes, json, os, resource, struct, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def fail(msg):
    os.write(2, ("sandbox: " + msg + "\n").encode()); os._exit(71)
mb = cfg["memory_mb"] << 20
for lim, val in ((resource.RLIMIT_AS, mb), (resource.RLIMIT_FSIZE, 16 << 20), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(lim, (val, val))
cpu = max(1, int(-(-cfg["cpu_s"] // 1)))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
if cfg["max_procs"] > 1:
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["max_procs"], cfg["max_procs"]))
# no capabilities, now or after an exec (matters when the trainer runs as root without a user namespace)
for cap in range(64):
    libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP; refused without CAP_SETPCAP, when there is nothing to drop
libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
if libc.capset(struct.pack("Ii", 0x20080522, 0), bytes(24)):  # _LINUX_CAPABILITY_VERSION_3, two zeroed sets
    fail("capset failed: " + os.strerror(ctypes.get_errno()))
if libc.prctl(38, 1, 0, 0, 0):  # PR_SET_NO_NEW_PRIVS: required by Landlock and unprivileged seccomp
    fail("prctl(PR_SET_NO_NEW_PRIVS) failed")
abi = libc.syscall(444, None, 0, 1) if cfg["landlock"] else -1  # LANDLOCK_CREATE_RULESET_VERSION
if abi > 0:
    fs = (1 << 13) - 1 | (abi >= 2) << 13 | (abi >= 3) << 14 | (abi >= 5) << 15
    attr = struct.pack("QQQ", fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    rs = libc.syscall(444, attr, len(attr), 0)
    if rs < 0:
        fail("landlock_create_ruleset failed: " + os.strerror(ctypes.get_errno()))
    file_rights = 1 | 2 | 4 | ((abi >= 3) << 14)  # execute, write, read (+ truncate)
    def allow(path, rights):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        if not os.path.isdir(path):
            rights &= file_rights
        if libc.syscall(445, rs, 1, struct.pack("=Qi", rights, fd), 0):
            fail("landlock_add_rule(" + path + ") failed: " + os.strerror(ctypes.get_errno()))
        os.close(fd)
    for p in cfg["read"]:
        allow(p, 1 | 4 | 8)  # execute, read file, read dir
    allow("/dev/null", 2 | 4)
    for dev in ("/dev/zero", "/dev/urandom", "/dev/random"):
        allow(dev, 4)
    allow(os.getcwd(), fs)
    if libc.syscall(446, rs, 0):
        fail("landlock_restrict_self failed: " + os.strerror(ctypes.get_errno()))
prog = bytes.fromhex(cfg["seccomp"]).replace(bytes.fromhex(cfg["pid_mark"]), os.getpid().to_bytes(4, sys.byteorder))
pbuf = ctypes.create_string_buffer(prog, len(prog))
fprog = struct.pack("HxxxxxxP", len(prog) // 8, ctypes.addressof(pbuf))
buf = ctypes.create_string_buffer(fprog, len(fprog))
if libc.prctl(22, 2, buf, 0, 0):  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    fail("seccomp filter refused: " + os.strerror(ctypes.get_errno()))
del ctypes, libc, buf, pbuf, prog, fprog
sys.argv = ["main.py"]
g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
with open("main.py", encoding="utf-8") as f:
    src = f.read()
exec(compile(src, "main.py", "exec"), g)
"""

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
            clone=56, clone3=435, fork=57, vfork=58,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            socket=198, ptrace=117, process_vm_readv=270, process_vm_writev=271, io_uring_setup=425,
            kill=129, tkill=130, tgkill=131, pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438,
            clone=220, clone3=435,
        ),
    ),
}  # fmt: skip


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return code.to_bytes(2, sys.byteorder) + bytes([jt, jf]) + (k & 0xFFFFFFFF).to_bytes(4, sys.byteorder)


PID_MARK = 0x7A7A7A7A  # replaced by the launcher with its own pid (the one process it may signal)


def seccomp_program(no_processes: bool) -> bytes | None:
    """The filter as bytes for this machine (None: an architecture we have no syscall table for).

    Denied with EPERM: socket, ptrace, process_vm_*, io_uring_setup, pidfd_*; kill/tkill/tgkill unless aimed at
    the process itself (its pid, which the launcher writes over PID_MARK, or 0 = its group); with `no_processes` also fork/vfork and clone
    without CLONE_THREAD (clone3 gets ENOSYS, so the C library falls back to clone for threads). Another
    architecture (e.g. 32-bit calls on x86_64) kills the process."""
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
    denied = ["socket", "ptrace", "process_vm_readv", "process_vm_writev", "io_uring_setup", "pidfd_open"]
    denied += ["pidfd_getfd", "pidfd_send_signal"]
    if no_processes:
        denied += [n for n in ("fork", "vfork") if n in nr]
    for name in denied:
        out += [_ins(jeq, nr[name], 0, 1), _ins(ret, _EPERM)]
    if no_processes:
        out += [_ins(jeq, nr["clone3"], 0, 1), _ins(ret, _ENOSYS)]
        # clone: allowed only for threads
        out += [_ins(jeq, nr["clone"], 0, 4), _ins(ld, lo0), _ins(jset, 0x00010000, 1, 0), _ins(ret, _EPERM)]
        out += [_ins(ret, _ALLOW)]
    for name in ("kill", "tkill", "tgkill"):
        # signals only to itself: its pid (in the namespace it sees) or 0 (its process group) for kill/tgkill
        out += [_ins(jeq, nr[name], 0, 5), _ins(ld, lo0), _ins(jeq, PID_MARK, 2, 0)]
        out += [_ins(jeq, 0, 1, 0), _ins(ret, _EPERM), _ins(ret, _ALLOW)]
    out.append(_ins(ret, _ALLOW))
    return b"".join(out)


# ---------------------------------------------------------------------------------------------- isolation


@functools.cache
def isolation() -> dict[str, object]:
    """What this machine gives the sandbox, probed once: {namespaces, landlock_abi, seccomp}."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = int(libc.syscall(444, None, 0, 1)) if sys.platform == "linux" else -1
    unshare = shutil.which("unshare")
    namespaces = False
    if unshare:
        try:
            namespaces = (
                subprocess.run(
                    [unshare, "--user", "--net", sys.executable, "-I", "-S", "-c", "pass"],
                    capture_output=True,
                    timeout=30,
                    env=_env("/"),
                ).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            namespaces = False
    info = {"namespaces": namespaces, "landlock_abi": max(abi, 0), "seccomp": seccomp_program(True) is not None}
    log.info(
        "sandbox: seccomp %s, Landlock ABI %s, user+net namespaces %s",
        "yes" if info["seccomp"] else "NO (nothing will run)",
        info["landlock_abi"] or "none (writes are confined by file permissions only)",
        "yes" if namespaces else "no (no network via seccomp only)",
    )
    return info


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}


def _read_roots() -> list[str]:
    roots = {sys.base_prefix, sys.base_exec_prefix, *_READ_ROOTS}
    return sorted(r for r in roots if os.path.exists(r))


# ---------------------------------------------------------------------------------------------------- run


def run_python(code: str, *, stdin: str = "", limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` as a program with `stdin`, under `limits`; never raises for anything the program does."""
    info = isolation()
    start = time.monotonic()
    program = seccomp_program(no_processes=limits.max_procs == 1)
    if program is None:
        return SandboxResult("", "", None, False, "sandbox unavailable: no seccomp syscall table for this CPU", 0.0)
    work = tempfile.mkdtemp(prefix="rlft-sandbox-")
    try:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        cfg = {
            "memory_mb": limits.memory_mb,
            "cpu_s": limits.cpu_s,
            "max_procs": limits.max_procs,
            "landlock": bool(info["landlock_abi"]),
            "read": _read_roots(),
            "seccomp": program.hex(),
            "pid_mark": PID_MARK.to_bytes(4, sys.byteorder).hex(),
        }
        cmd = [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(cfg)]
        if info["namespaces"]:  # unshare execs the launcher (no fork): the pid the filter allows is the launcher's
            cmd = [shutil.which("unshare") or "unshare", "--user", "--net", *cmd]
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=work,
                env=_env(work),
                start_new_session=True,  # its own process group: killed as a whole, never our signals
            )
        except OSError as e:
            return SandboxResult("", "", None, False, f"sandbox could not start: {e}", time.monotonic() - start)
        try:
            out, err, stop = _communicate(proc, stdin.encode(), start + limits.wall_s, limits.max_output_bytes)
        finally:
            _kill_group(proc)
        seconds = time.monotonic() - start
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        if stop == "wall":
            return SandboxResult(stdout, stderr, None, True, f"wall time limit ({limits.wall_s:g} s)", seconds)
        if stop == "output":
            return SandboxResult(
                stdout, stderr, None, False, f"output limit ({limits.max_output_bytes} bytes)", seconds
            )
        return SandboxResult(stdout, stderr, proc.returncode, False, _error(proc.returncode, stderr, limits), seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_many(
    jobs: Sequence[tuple[str, str]], limits: SandboxLimits = SandboxLimits(), workers: int = 4
) -> list[SandboxResult]:
    """`run_python(code, stdin=stdin)` for each (code, stdin), `workers` at a time (threads, each waiting on its
    own child process), in the order given."""
    if workers <= 1 or len(jobs) <= 1:
        return [run_python(c, stdin=s, limits=limits) for c, s in jobs]
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run_python(job[0], stdin=job[1], limits=limits), jobs))


def _error(returncode: int, stderr: str, limits: SandboxLimits) -> str | None:
    if returncode == SANDBOX_EXIT and stderr.startswith("sandbox: "):
        return stderr.splitlines()[0]
    if returncode == -signal.SIGXCPU:
        return f"cpu time limit ({limits.cpu_s:g} s)"
    if returncode == -signal.SIGXFSZ:
        return "file size limit (16 MiB)"
    if returncode < 0:
        return f"killed by signal {-returncode}"
    if returncode != 0 and "MemoryError" in stderr[-2000:]:
        return "memory limit"
    if returncode != 0 and "File too large" in stderr[-2000:]:  # Python ignores SIGXFSZ: the write fails (EFBIG)
        return "file size limit (16 MiB)"
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
