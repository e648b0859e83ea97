"""The sandbox's trusted launcher: envs/sandbox.py runs this file's source as `python -I -S -c <source> <cfg json>`
for every model-written program, and it runs before any of that program's code. It reads the program from stdin,
enters new namespaces, builds the program's root, forks an init and the program under it, confines the program's
process and runs the program there (the layers and why each: envs/sandbox.py's docstring and docs/sandbox.md).

A module of its own so that the linter and the tests read it as code; importing it does nothing, only running it as
the main program does. Standard library only and no project import: it runs isolated (`-I -S`), without the
repository or any site-packages on its path.
"""

from __future__ import annotations

import builtins
import ctypes
import gc
import json
import os
import resource
import signal
import struct
import sys

SANDBOX_EXIT = 71  # the launcher could not confine the program (EX_OSERR): nothing of it ran

# unshare flags: CLONE_NEWUSER, NEWNS, NEWPID, NEWIPC, NEWUTS, NEWNET, NEWCGROUP
NEW_NAMESPACES = 0x10000000 | 0x20000 | 0x20000000 | 0x08000000 | 0x04000000 | 0x40000000 | 0x02000000
# mount flags
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18


def fail(msg: str) -> None:
    os.write(2, ("sandbox: " + msg + "\n").encode())
    os._exit(SANDBOX_EXIT)


def check(ret: int, what: str) -> None:
    if ret < 0:
        fail(what + " failed: " + os.strerror(ctypes.get_errno()))


def load_libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def read_program() -> bytes:
    """The program's source, first on stdin: its length in bytes on one line, then the bytes (its stdin follows)."""
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
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def enter_namespaces(libc: ctypes.CDLL, cfg: dict) -> None:
    """New user, mount, PID, IPC, UTS, network and cgroup namespaces. Only a process outside the new user namespace
    may map a uid other than its own, so a helper forked first writes the maps: a root trainer's program becomes host
    uid `root_maps_to`, anyone else's keeps its uid."""
    inside = cfg["uid"]
    euid, egid = os.geteuid(), os.getegid()
    if euid == 0:
        os.setgroups([])  # no supplementary groups (root's group 0 among them)
        uid_map = f"0 0 1\n{inside} {cfg['root_maps_to']} 1\n"
        gid_map = uid_map
    else:
        uid_map, gid_map = f"{inside} {euid} 1\n", f"{inside} {egid} 1\n"
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        os.close(done_r)
        try:
            if os.read(ready_r, 1) == b"u":
                for name, text in (("setgroups", "deny"), ("uid_map", uid_map), ("gid_map", gid_map)):
                    with open(f"/proc/{os.getppid()}/{name}", "w") as f:
                        f.write(text)
                os.write(done_w, b"k")
        except OSError as e:
            os.write(2, f"sandbox: writing the user namespace's id maps failed: {e}\n".encode())
        os._exit(0)
    os.close(ready_r)
    os.close(done_w)
    if libc.unshare(NEW_NAMESPACES):
        fail(
            "new user/mount/pid/ipc/uts/net/cgroup namespaces refused (" + os.strerror(ctypes.get_errno()) + "): "
            "allow user namespaces (user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1; Ubuntu: "
            "kernel.apparmor_restrict_unprivileged_userns=0; in Docker: --security-opt seccomp=unconfined)"
        )
    os.write(ready_w, b"u")
    mapped = os.read(done_r, 1) == b"k"
    os.waitpid(helper, 0)
    os.close(ready_w)
    os.close(done_r)
    if not mapped:
        fail("the user namespace's id maps could not be written")


def mount(libc: ctypes.CDLL, src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None):
    def encoded(s):
        return None if s is None else s.encode()

    check(libc.mount(encoded(src), encoded(dst), encoded(fstype), flags, encoded(data)), "mount " + dst)


def kept_flags(path: str) -> int:
    """The flags the kernel locked on the mount at `path`, which a remount must repeat."""
    f = os.statvfs(path).f_flag
    atime = 1024 if f & 1024 else (1 << 21) if f & 4096 else (1 << 24)  # noatime, relatime, strictatime
    return (f & (NOSUID | NODEV | NOEXEC)) | (2048 if f & 2048 else 0) | atime


def read_only(libc: ctypes.CDLL, path: str) -> None:
    mount(libc, None, path, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV | kept_flags(path))


def build_root(libc: ctypes.CDLL, cfg: dict, source: bytes) -> None:
    """The new root, entered: a tmpfs with read-only binds of what the interpreter needs (`binds`, with `hide`
    covered by empty tmpfs), four devices and ld.so.cache, and the program as /tmp/main.py on a tmpfs of
    `disk_mb`; the host's tree detached, the working directory /tmp."""
    inside = cfg["uid"]
    if libc.mount(None, b"/", None, REC | PRIVATE, None):
        fail(
            "mounts in the new namespaces refused (" + os.strerror(ctypes.get_errno()) + "): Ubuntu 24.04 gives "
            "unprivileged user namespaces no capabilities unless kernel.apparmor_restrict_unprivileged_userns=0"
        )
    mount(libc, "tmpfs", "/tmp", "tmpfs", NOSUID | NODEV, "mode=0755,size=64k,nr_inodes=64")
    os.mkdir("/tmp/old")
    os.mkdir("/tmp/new")
    check(libc.syscall(cfg["pivot_root"], b"/tmp", b"/tmp/old"), "pivot_root")  # the host's tree is now /old
    os.chdir("/")
    mount(libc, "tmpfs", "/new", "tmpfs", NOSUID | NODEV, "mode=0755,size=256k,nr_inodes=4096")
    for path in cfg["binds"]:
        os.makedirs("/new" + path, exist_ok=True)
        mount(libc, "/old" + path, "/new" + path, None, BIND)
        read_only(libc, "/new" + path)
    for path in cfg["hide"]:  # site-packages and the like inside a bind: an empty, read-only tmpfs over them
        mount(libc, "tmpfs", "/new" + path, "tmpfs", RDONLY | NOSUID | NODEV | NOEXEC, "mode=0555,size=4k,nr_inodes=1")
    os.makedirs("/new/dev")
    os.makedirs("/new/etc")
    for path in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/etc/ld.so.cache"):
        if os.path.exists("/old" + path):
            os.close(os.open("/new" + path, os.O_CREAT | os.O_WRONLY, 0o644))
            mount(libc, "/old" + path, "/new" + path, None, BIND)
            if path.startswith("/etc"):
                read_only(libc, "/new" + path)
    os.mkdir("/new/tmp")
    tmp = f"mode=0700,uid={inside},gid={inside},size={cfg['disk_mb']}m,nr_inodes={cfg['inodes']}"
    mount(libc, "tmpfs", "/new/tmp", "tmpfs", NOSUID | NODEV, tmp)
    fd = os.open("/new/tmp/main.py", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, source)
    os.fchown(fd, inside, inside)
    os.close(fd)
    os.chdir("/new")
    check(libc.syscall(cfg["pivot_root"], b".", b"."), "pivot_root")  # the old root now sits on top: detach it
    check(libc.umount2(b".", 2), "umount of the host's tree")  # MNT_DETACH
    os.chdir("/")
    read_only(libc, "/")
    libc.sethostname(b"sandbox", 7)
    os.chdir("/tmp")


def fork_init_and_program(libc: ctypes.CDLL) -> None:
    """Fork an init (PID 1 of the namespace: when it exits the kernel kills everything left there) that dies with
    this launcher, and under it the program (PID 2: as init it would ignore its own signals, SIGXCPU among them).
    Returns in the program's process only; the launcher ends the way the program did."""
    alive_r, alive_w = os.pipe()
    status_r, status_w = os.pipe()
    gc.freeze()  # the collector in the forks below then leaves the launcher's objects (and their shared pages) alone
    init = os.fork()
    if init:
        os.close(alive_r)
        os.close(status_w)
        end_as_the_program_did(init, status_r)
    os.close(alive_w)
    os.close(status_r)
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: SIGKILL when the launcher dies
    os.set_blocking(alive_r, False)
    try:
        if os.read(alive_r, 1) == b"":  # the launcher died before the line above: stop
            os._exit(SANDBOX_EXIT)
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


def end_as_the_program_did(init: int, status_r: int) -> None:
    """The launcher's end: read the program's wait status from the init and exit with it (killed by the same
    signal), so the parent reads the program's own status."""
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
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)


def confine(libc: ctypes.CDLL, cfg: dict) -> None:
    """The program process's own fences: its process group, no capabilities, uid `uid`, the rlimits,
    no_new_privs, Landlock (where the kernel has it and `landlock`) and the seccomp filter `seccomp`."""
    os.setpgid(0, 0)  # its own process group: a signal it sends to its group reaches only itself and its children
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP, while CAP_SETPCAP is still held
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    inside = cfg["uid"]
    os.setresgid(inside, inside, inside)
    os.setresuid(inside, inside, inside)
    if libc.capset(struct.pack("Ii", 0x20080522, 0), bytes(24)):  # _LINUX_CAPABILITY_VERSION_3, two zeroed sets
        fail("capset failed: " + os.strerror(ctypes.get_errno()))
    mb = cfg["memory_mb"] << 20
    cpu = max(1, int(-(-cfg["cpu_s"] // 1)))
    for lim, val in (
        (resource.RLIMIT_AS, (mb, mb)),
        (resource.RLIMIT_FSIZE, (cfg["file_mb"] << 20,) * 2),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2),
        (resource.RLIMIT_NPROC, (cfg["tasks"],) * 2),
        (resource.RLIMIT_MEMLOCK, (0, 0)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),
    ):
        resource.setrlimit(lim, val)
    if libc.prctl(38, 1, 0, 0, 0):  # PR_SET_NO_NEW_PRIVS: required by Landlock and unprivileged seccomp
        fail("prctl(PR_SET_NO_NEW_PRIVS) failed")
    abi = libc.syscall(444, None, 0, 1) if cfg["landlock"] else -1  # LANDLOCK_CREATE_RULESET_VERSION
    if abi > 0:
        restrict_with_landlock(libc, abi)
    prog = bytes.fromhex(cfg["seccomp"]).replace(bytes.fromhex(cfg["pid_mark"]), os.getpid().to_bytes(4, sys.byteorder))
    pbuf = ctypes.create_string_buffer(prog, len(prog))
    fprog = struct.pack("HxxxxxxP", len(prog) // 8, ctypes.addressof(pbuf))
    buf = ctypes.create_string_buffer(fprog, len(fprog))
    if libc.prctl(22, 2, buf, 0, 0):  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        fail("seccomp filter refused: " + os.strerror(ctypes.get_errno()))


def restrict_with_landlock(libc: ctypes.CDLL, abi: int) -> None:
    """Landlock at ABI `abi`: reads and execution anywhere in the new root, writes only in /tmp and /dev/null; TCP,
    signals and abstract sockets scoped where the ABI has them."""
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


def run_program() -> None:
    """Run /tmp/main.py as the main module, then end the way the interpreter would (exit code, traceback, non-daemon
    threads, atexit, flushed output) but through os._exit: a forked interpreter tearing itself down writes to every
    page it shares with the launcher, which costs more than many programs take to run."""
    sys.argv = ["main.py"]
    g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    with open("main.py", encoding="utf-8", errors="replace") as f:
        src = f.read()
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


def main(cfg: dict) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = load_libc()
    source = read_program()
    enter_namespaces(libc, cfg)
    build_root(libc, cfg, source)
    fork_init_and_program(libc)
    confine(libc, cfg)
    del libc, source, cfg  # the program runs below this frame and needs none of them
    run_program()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
