"""Run model-written Python in a confined child process: the code reward (rewards/code_tests.py) and the Python tool
run every program through `run_python` (threat model, layers and limits: docs/sandbox.md).

Each program gets a launcher process, fresh namespaces and an init. The launcher (trusted code, run as
`python -I -S`) reads the program from its stdin, then:
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

Past 400 lines because every confinement layer above is written out here (the launcher's namespaces, mounts and
Landlock rules, the seccomp program, the bounded output reader), so that the whole threat surface is reviewed in
one file.
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

log = logging.getLogger(__name__)

SANDBOX_EXIT = 71  # the launcher could not confine the program (EX_OSERR): nothing of it ran
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


# The trusted launcher. It runs as `python -I -S -c _LAUNCHER <cfg>` before any model-written code: it reads the
# program, builds its namespaces and root, forks an init and the program under it, and waits.
_LAUNCHER = r"""
import ctypes, json, os, resource, signal, struct, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
def fail(msg):
    os.write(2, ("sandbox: " + msg + "\n").encode()); os._exit(71)
def check(ret, what):
    if ret < 0:
        fail(what + " failed: " + os.strerror(ctypes.get_errno()))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
# the program's source comes first on stdin: its length in bytes on one line, then the bytes
head = b""
while not head.endswith(b"\n"):
    c = os.read(0, 1)
    if not c or len(head) > 20:
        fail("no program on stdin")
    head += c
left, parts = int(head), []
while left:
    chunk = os.read(0, min(left, 1 << 20))
    if not chunk:
        fail("program cut short on stdin")
    parts.append(chunk); left -= len(chunk)
source = b"".join(parts)
# --- namespaces. Only a process outside the new user namespace may map a uid other than its own, so a helper
# forked first writes the maps: a root trainer's program becomes host uid 65534, anyone else's keeps its uid.
IN = cfg["uid"]
euid, egid = os.geteuid(), os.getegid()
if euid == 0:
    os.setgroups([])  # no supplementary groups (root's group 0 among them)
    uid_map = "0 0 1\n%d %d 1\n" % (IN, cfg["root_maps_to"])
    gid_map = "0 0 1\n%d %d 1\n" % (IN, cfg["root_maps_to"])
else:
    uid_map, gid_map = "%d %d 1\n" % (IN, euid), "%d %d 1\n" % (IN, egid)
ready_r, ready_w = os.pipe(); done_r, done_w = os.pipe()
helper = os.fork()
if helper == 0:
    os.close(ready_w); os.close(done_r)
    try:
        if os.read(ready_r, 1) == b"u":
            for name, text in (("setgroups", "deny"), ("uid_map", uid_map), ("gid_map", gid_map)):
                with open("/proc/%d/%s" % (os.getppid(), name), "w") as f:
                    f.write(text)
            os.write(done_w, b"k")
    except OSError as e:
        os.write(2, ("sandbox: writing the user namespace's id maps failed: %s\n" % e).encode())
    os._exit(0)
os.close(ready_r); os.close(done_w)
NS = 0x10000000 | 0x20000 | 0x20000000 | 0x08000000 | 0x04000000 | 0x40000000 | 0x02000000
if libc.unshare(NS):
    fail("new user/mount/pid/ipc/uts/net/cgroup namespaces refused (" + os.strerror(ctypes.get_errno())
         + "): allow user namespaces (user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1; Ubuntu: "
         "kernel.apparmor_restrict_unprivileged_userns=0; in Docker: --security-opt seccomp=unconfined)")
os.write(ready_w, b"u")
mapped = os.read(done_r, 1) == b"k"
os.waitpid(helper, 0)
os.close(ready_w); os.close(done_r)
if not mapped:
    fail("the user namespace's id maps could not be written")
# --- the new root: a tmpfs with read-only binds of what the interpreter needs, a tmpfs /tmp, four devices
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
def mount(src, dst, fstype, flags, data=None):
    e = lambda s: None if s is None else s.encode()
    check(libc.mount(e(src), e(dst), e(fstype), flags, e(data)), "mount " + dst)
def keep_flags(path):  # a remount must repeat the flags the kernel locked on the source mount
    f = os.statvfs(path).f_flag
    atime = 1024 if f & 1024 else (1 << 21) if f & 4096 else (1 << 24)  # noatime, relatime, strictatime
    return (f & (NOSUID | NODEV | NOEXEC)) | (2048 if f & 2048 else 0) | atime
def read_only(path):
    mount(None, path, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV | keep_flags(path))
if libc.mount(None, b"/", None, REC | PRIVATE, None):
    fail("mounts in the new namespaces refused (" + os.strerror(ctypes.get_errno()) + "): Ubuntu 24.04 gives "
         "unprivileged user namespaces no capabilities unless kernel.apparmor_restrict_unprivileged_userns=0")
mount("tmpfs", "/tmp", "tmpfs", NOSUID | NODEV, "mode=0755,size=64k,nr_inodes=64")
os.mkdir("/tmp/old"); os.mkdir("/tmp/new")
check(libc.syscall(cfg["pivot_root"], b"/tmp", b"/tmp/old"), "pivot_root")  # the host's tree is now /old
os.chdir("/")
mount("tmpfs", "/new", "tmpfs", NOSUID | NODEV, "mode=0755,size=256k,nr_inodes=4096")
for path in cfg["binds"]:
    os.makedirs("/new" + path, exist_ok=True)
    mount("/old" + path, "/new" + path, None, BIND)
    read_only("/new" + path)
for path in cfg["hide"]:  # site-packages and the like inside a bind: an empty, read-only tmpfs over them
    mount("tmpfs", "/new" + path, "tmpfs", RDONLY | NOSUID | NODEV | NOEXEC, "mode=0555,size=4k,nr_inodes=1")
os.makedirs("/new/dev"); os.makedirs("/new/etc")
for path in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/etc/ld.so.cache"):
    if os.path.exists("/old" + path):
        os.close(os.open("/new" + path, os.O_CREAT | os.O_WRONLY, 0o644))
        mount("/old" + path, "/new" + path, None, BIND)
        if path.startswith("/etc"):
            read_only("/new" + path)
os.mkdir("/new/tmp")
mount("tmpfs", "/new/tmp", "tmpfs", NOSUID | NODEV, "mode=0700,uid=%d,gid=%d,size=%dm,nr_inodes=%d"
      % (IN, IN, cfg["disk_mb"], cfg["inodes"]))
fd = os.open("/new/tmp/main.py", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
os.write(fd, source); os.fchown(fd, IN, IN); os.close(fd)
os.chdir("/new")
check(libc.syscall(cfg["pivot_root"], b".", b"."), "pivot_root")  # the old root now sits on top: detach it
check(libc.umount2(b".", 2), "umount of the host's tree")  # MNT_DETACH
os.chdir("/")
read_only("/")
libc.sethostname(b"sandbox", 7)
os.chdir("/tmp")
# --- an init (PID 1 of the namespace: when it exits the kernel kills everything left there) that dies with this
# launcher, and under it the program (PID 2: as init it would ignore its own signals, SIGXCPU among them)
alive_r, alive_w = os.pipe()
status_r, status_w = os.pipe()
import gc
gc.freeze()  # the collector in the forks below then leaves the launcher's objects (and their shared pages) alone
init = os.fork()
if init:
    os.close(alive_r); os.close(status_w)
    for fd in (0, 1, 2):
        os.close(fd)
    raw = b""
    while len(raw) < 4:
        chunk = os.read(status_r, 4 - len(raw))
        if not chunk:
            break
        raw += chunk
    os.waitpid(init, 0)
    status = int.from_bytes(raw, "little") if len(raw) == 4 else 9  # no report: the init was killed
    if os.WIFSIGNALED(status):  # end the way the program ended, so the parent reads the same status
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)
os.close(alive_w); os.close(status_r)
libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: SIGKILL when the launcher dies
os.set_blocking(alive_r, False)
try:
    if os.read(alive_r, 1) == b"":  # the launcher died before the line above: stop
        os._exit(71)
except BlockingIOError:
    pass
os.close(alive_r)
program = os.fork()
if program:
    for fd in (0, 1, 2):
        os.close(fd)
    while True:  # reap orphans until the program itself ends, then report how
        pid, status = os.wait()
        if pid == program:
            os.write(status_w, status.to_bytes(4, "little"))
            os._exit(0)
os.close(status_w)
os.setpgid(0, 0)  # its own process group: a signal it sends to its group reaches only itself and its children
for cap in range(64):
    libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP, while CAP_SETPCAP is still held
libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
os.setresgid(IN, IN, IN); os.setresuid(IN, IN, IN)
if libc.capset(struct.pack("Ii", 0x20080522, 0), bytes(24)):  # _LINUX_CAPABILITY_VERSION_3, two zeroed sets
    fail("capset failed: " + os.strerror(ctypes.get_errno()))
mb = cfg["memory_mb"] << 20
cpu = max(1, int(-(-cfg["cpu_s"] // 1)))
for lim, val in (
    (resource.RLIMIT_AS, (mb, mb)), (resource.RLIMIT_FSIZE, (cfg["file_mb"] << 20,) * 2),
    (resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2),
    (resource.RLIMIT_NPROC, (cfg["tasks"],) * 2), (resource.RLIMIT_MEMLOCK, (0, 0)),
    (resource.RLIMIT_MSGQUEUE, (0, 0)),
):
    resource.setrlimit(lim, val)
if libc.prctl(38, 1, 0, 0, 0):  # PR_SET_NO_NEW_PRIVS: required by Landlock and unprivileged seccomp
    fail("prctl(PR_SET_NO_NEW_PRIVS) failed")
abi = libc.syscall(444, None, 0, 1) if cfg["landlock"] else -1  # LANDLOCK_CREATE_RULESET_VERSION
if abi > 0:
    fs = (1 << 13) - 1 | (abi >= 2) << 13 | (abi >= 3) << 14 | (abi >= 5) << 15
    attr = struct.pack("QQQ", fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    rs = libc.syscall(444, attr, len(attr), 0)
    check(rs, "landlock_create_ruleset")
    def allow(path, rights):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        if not os.path.isdir(path):
            rights &= 1 | 2 | 4 | ((abi >= 3) << 14)  # execute, write, read (+ truncate)
        check(libc.syscall(445, rs, 1, struct.pack("=Qi", rights, fd), 0), "landlock_add_rule(" + path + ")")
        os.close(fd)
    allow("/", 1 | 4 | 8)  # execute, read file, read dir: the new root holds only what was bound into it
    allow("/dev/null", 2 | 4)
    allow("/tmp", fs)
    check(libc.syscall(446, rs, 0), "landlock_restrict_self")
prog = bytes.fromhex(cfg["seccomp"]).replace(bytes.fromhex(cfg["pid_mark"]), os.getpid().to_bytes(4, sys.byteorder))
pbuf = ctypes.create_string_buffer(prog, len(prog))
fprog = struct.pack("HxxxxxxP", len(prog) // 8, ctypes.addressof(pbuf))
buf = ctypes.create_string_buffer(fprog, len(fprog))
if libc.prctl(22, 2, buf, 0, 0):  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    fail("seccomp filter refused: " + os.strerror(ctypes.get_errno()))
del ctypes, libc, buf, pbuf, prog, fprog, source, cfg
sys.argv = ["main.py"]
g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
with open("main.py", encoding="utf-8", errors="replace") as f:
    src = f.read()
# Run it, then end the way the interpreter would (exit code, traceback, non-daemon threads, atexit, flushed output)
# but through os._exit: a forked interpreter tearing itself down writes to every page it shares with the
# launcher, which costs more than many programs take to run.
status = 0
try:
    exec(compile(src, "main.py", "exec"), g)
except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
        status = (e.code or 0) & 0xFF
    else:
        print(e.code, file=sys.stderr)
        status = 1
except BaseException:
    sys.excepthook(*sys.exc_info())
    status = 1
try:
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    import atexit
    atexit._run_exitfuncs()
except BaseException:
    sys.excepthook(*sys.exc_info())
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
os._exit(status)
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
    if returncode == SANDBOX_EXIT and stderr.startswith("sandbox: "):
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
