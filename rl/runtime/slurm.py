"""Each SLURM job's own Ray cluster, inside its allocation.

A run inside a SLURM job (`SLURM_JOB_ID` set: a sweep job of `hydra/launcher=slurm`, slurm/rlft.sbatch, `srun python
train.py`) never joins a Ray cluster it did not start: on shared nodes, a plain `ray.init()` would join whatever
cluster another job or user started there. So each job starts its own: the head on the allocation's first node and a
worker on each other node of the job step, every node with a temp dir and ports of its own derived from
`SLURM_JOB_ID` (two jobs on one node never share a socket or a port), token authentication with a token of the job's
(`RAY_AUTH_TOKEN`, which the launcher and the batch script make per job), and the CPUs and GPUs SLURM granted on that
node (Ray's own detection sees the whole node, and its threads then starve under SLURM's CPU limits).

In a run (rl/runtime/placement.py start_ray, cluster.address=null): the process of rank 0 starts the head and waits for
the step's other ranks, which join as workers (hydra_plugins/rlft_slurm_launcher/slurm_launcher.py). From the shell
(slurm/rlft.sbatch): `python -m rl.runtime.slurm node --log-dir DIR` is one node's part (the head on rank 0, unless
`--worker`), `python -m rl.runtime.slurm wait` prints the head's address once every node of the allocation has joined.
Each node's `ray start` output and, when it stops, Ray's own session logs land in the log dir (the run directory's
logs/nodes/<host>/).

SLURM's stop (the time limit's warning, `scancel --signal=TERM`, preemption) is a SIGTERM to every process of every
job step (proctrack/cgroup, linuxproc), Ray's too, and a driver whose own node's Ray ends is ended by Ray (exit 1)
before it can say it was interrupted. So slurm/rlft.sbatch runs the head's node in its batch step, which that signal
misses (not preemption's); a node process that gets it writes <log dir>/.terminated at once, on which the script
requeues a run that did not finish, and keeps its Ray, in a session of its own (out of a signal to the step's process
group, proctrack/pgid), up until train.py has ended (`.stop`) or STOP_GRACE_S have passed (`serve_node`).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rl.errors import UserFacingError

HEAD_TIMEOUT_S = 120.0  # the head, and the job's other nodes, must be up by then, or the job fails with one line
PORT_BASE, PORT_SLOTS, PORTS_PER_JOB = 20000, 4000, 10  # per-job ports: 20000-59999, above Ray's worker ports
STOP_FILE = ".stop"  # slurm/rlft.sbatch creates <log dir>/.stop when train.py has ended: every node's Ray stops
TERM_FILE = ".terminated"  # written by a node process that got SIGTERM: slurm/rlft.sbatch requeues an unfinished run
STOP_GRACE_S = 90.0  # after SIGTERM a node's Ray waits this long for `.stop`: below the 120 s of the time-limit warning
# Ray's processes ignore SIGUSR2, SLURM's warning before the time limit to every process of a sweep job's step (on which
# submitit requeues the job): its default action would end the job's Ray, and Ray the driver before it has requeued.
IGNORE_USR2 = ["/bin/sh", "-c", 'trap "" USR2; exec "$@"', "sh"]  # an ignored signal stays ignored across exec


class SlurmError(UserFacingError):
    """A SLURM job whose Ray cluster cannot start or cannot hold the run (one line, with what to change)."""


@dataclass(frozen=True)
class Allocation:
    """What SLURM granted the job this process runs in, on this node."""

    job_id: str
    hosts: tuple[str, ...]  # the allocation's nodes; the first holds the head
    rank: int  # this task's rank in its job step (SLURM_PROCID; 0 in the batch script)
    step_nodes: int  # nodes of this job step (1 in the batch script; the submitit launcher's `nodes`)
    local_rank: int  # this task's rank on its node (SLURM_LOCALID): only the first task of a node runs its Ray
    cpus: int  # CPUs on this node (SLURM_CPUS_ON_NODE)
    gpus: int  # GPUs on this node (CUDA_VISIBLE_DEVICES as SLURM set it, else SLURM_GPUS_ON_NODE)
    mem_mb: int | None  # memory on this node (SLURM_MEM_PER_NODE), when the job asked for some

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Allocation | None:
        """The allocation, or None outside a SLURM job."""
        env = dict(os.environ) if env is None else env
        job_id = env.get("SLURM_JOB_ID")
        if not job_id:
            return None
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or socket.gethostname()
        mem = env.get("SLURM_MEM_PER_NODE")
        return cls(
            job_id=job_id,
            hosts=tuple(hostnames(nodelist)),
            rank=int(env.get("SLURM_PROCID", "0")),
            step_nodes=int(env.get("SLURM_STEP_NUM_NODES") or "1"),
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            cpus=int(env.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1),
            gpus=gpus_on_node(env),
            mem_mb=int(mem) if mem and mem.isdigit() else None,
        )

    @property
    def gpus_total(self) -> int:
        return self.gpus * len(self.hosts)

    def describe(self) -> str:
        return f"SLURM job {self.job_id} ({len(self.hosts)} node(s) x {self.cpus} CPUs, {self.gpus} GPU(s))"


def hostnames(nodelist: str) -> list[str]:
    """SLURM's compressed node list (`gpu[01-03],cpu7`) as host names: `scontrol show hostnames` where it exists."""
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()
    hosts = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            hosts += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
    return hosts


def gpus_on_node(env: dict[str, str]) -> int:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() not in ("", "NoDevFiles"):
        return len([d for d in visible.split(",") if d.strip()])
    count = (env.get("SLURM_GPUS_ON_NODE") or "0").split("(")[0]
    return int(count) if count.isdigit() else 0


def job_ports(job_id: str) -> dict[str, int]:
    """Ports of this job's Ray on every node: a block of PORTS_PER_JOB chosen by the job ID, so that the workers know
    the head's port without asking and two jobs on one node never meet."""
    digits = int(re.sub(r"\D", "", job_id) or 0)
    base = PORT_BASE + (digits % PORT_SLOTS) * PORTS_PER_JOB
    names = ("gcs", "client", "dashboard", "agent_listen", "agent_grpc", "metrics", "runtime_env", "node_manager")
    return {name: base + i for i, name in enumerate(names)} | {"object_manager": base + len(names)}


def temp_dir(job_id: str) -> Path:
    """Ray's temp dir for this job on each node: short (Ray's socket paths must stay under 108 characters) and the
    job's own, so no other cluster's `ray_current_cluster` file or sockets are ever found."""
    return Path("/tmp") / f"rlft-ray-{job_id}"


def head_address(alloc: Allocation) -> str:
    return f"{socket.gethostbyname(alloc.hosts[0])}:{job_ports(alloc.job_id)['gcs']}"


def auth_env(alloc: Allocation) -> dict[str, str]:
    """Token authentication with the job's own token: the one the launcher or batch script exported for every node of
    the job, else (a single-node step) one made here."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    if not token:
        if alloc.step_nodes > 1:
            raise SlurmError(
                f"{alloc.describe()}: RAY_AUTH_TOKEN is not set, so the job's nodes share no Ray token: export one "
                "per job before srun (hydra/launcher=slurm and slurm/rlft.sbatch do)"
            )
        token = secrets.token_hex(32)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def ray_start_command(alloc: Allocation, head: bool) -> list[str]:
    """`ray start ... --block` for this node of the job: its temp dir, its ports, the CPUs and GPUs SLURM granted."""
    ports = job_ports(alloc.job_id)
    ray = str(Path(sys.executable).parent / "ray")
    command = [ray if os.path.exists(ray) else "ray", "start", "--block", "--disable-usage-stats"]
    command += [f"--temp-dir={temp_dir(alloc.job_id)}", f"--num-cpus={alloc.cpus}", f"--num-gpus={alloc.gpus}"]
    here = alloc.hosts[0] if head else socket.gethostname()
    command += [f"--node-ip-address={socket.gethostbyname(here)}"]
    command += [f"--node-manager-port={ports['node_manager']}", f"--object-manager-port={ports['object_manager']}"]
    command += [f"--dashboard-agent-listen-port={ports['agent_listen']}", f"--metrics-export-port={ports['metrics']}"]
    command += [
        f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--runtime-env-agent-port={ports['runtime_env']}",
    ]
    if alloc.mem_mb:  # Ray's default store (30% of the node's RAM) could pass the job's memory limit
        command += [f"--object-store-memory={int(alloc.mem_mb * 0.3 * 2**20)}"]
    if head:
        command += ["--head", f"--port={ports['gcs']}", "--include-dashboard=false"]
        command += [f"--dashboard-port={ports['dashboard']}", f"--ray-client-server-port={ports['client']}"]
    else:
        command += [f"--address={head_address(alloc)}"]
    return command


def check_gpus(alloc: Allocation, need: float, per_role: float) -> None:
    """The run's GPU layout must fit the allocation: `need` GPUs in all, each role's `per_role` on one node."""
    if need <= 0:
        return
    nodes = len(alloc.hosts)
    fix = "ask for more (hydra.launcher.gpus_per_node=..., hydra.launcher.nodes=...; sbatch --gpus-per-node, --nodes)"
    if alloc.gpus_total + 1e-9 < need:
        raise SlurmError(
            f"{alloc.describe()} has {alloc.gpus_total} GPU(s) and the layout needs {need:g}: {fix}, or fewer "
            "roles or GPUs per role (cluster.num_actors, cluster.gpus_per_actor, ...); plan=true shows the layout"
        )
    if per_role > alloc.gpus + 1e-9:
        raise SlurmError(
            f"{alloc.describe()}: one role needs {per_role:g} GPUs on one node and a node has {alloc.gpus}: {fix} "
            f"(each of {nodes} node(s))"
        )


class RayNode:
    """This node's `ray start --block`, its output in <log dir>/<host>.log; `stop()` ends it and copies Ray's session
    logs of this node beside it. It runs in a session of its own, so it is stopped exactly, and only by us, and with
    SIGUSR2 ignored (IGNORE_USR2)."""

    def __init__(self, alloc: Allocation, head: bool, log_dir: Path, command: list[str] | None = None):
        self.alloc, self.head, self.host = alloc, head, socket.gethostname()
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = log_dir / f"{self.host}.log"
        gcs = job_ports(alloc.job_id)["gcs"]
        if head and not port_free(gcs):
            raise SlurmError(
                f"{alloc.describe()}: port {gcs}, this job's Ray head port (from its job ID), is taken on {self.host}: "
                "another Ray is there; resubmit (a new job ID picks other ports)"
            )
        env = dict(os.environ) | auth_env(alloc) | {"RAY_gcs_rpc_server_reconnect_timeout_s": "20"}
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                IGNORE_USR2 + (command or ray_start_command(alloc, head)),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # `ray start --block` stops its node's processes
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        session = temp_dir(self.alloc.job_id) / "session_latest" / "logs"
        if session.is_dir():
            shutil.copytree(session, self.log_dir / self.host, dirs_exist_ok=True, ignore_dangling_symlinks=True)
        shutil.rmtree(temp_dir(self.alloc.job_id), ignore_errors=True)  # the job's own; its logs are copied

    def wait_until_up(self, timeout_s: float = HEAD_TIMEOUT_S) -> None:
        """Until the head's port answers (on every node: its worker is then joining), or one line naming the log."""
        host, _, port = head_address(self.alloc).rpartition(":")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            written = (temp_dir(self.alloc.job_id) / "ray_current_cluster").is_file()  # by the head, once up
            if not port_free(int(port), host) and (written or not self.head):
                return
            time.sleep(0.5)
        ended = self.proc.poll() is not None  # before stop(), which ends it
        self.stop()
        tail = last_line(self.log)
        raise SlurmError(
            f"{self.alloc.describe()}: the Ray head at {host}:{port} did not come up within {timeout_s:g} s"
            f"{' (ray start ended)' if ended else ''}: see {self.log}"
            f"{f' ({tail})' if tail else ''}"
        )


def port_free(port: int, host: str = "") -> bool:
    """Nothing listens on host:port (on this node when host is empty)."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host or "127.0.0.1", port)) != 0


def last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.is_file() else []
    return lines[-1][:200] if lines else ""


def wait_for_nodes(count: int, alloc: Allocation, timeout_s: float = HEAD_TIMEOUT_S) -> None:
    """In a process connected to the job's Ray: until `count` nodes are alive, or one line."""
    import ray

    deadline = time.monotonic() + timeout_s
    alive = 0
    while time.monotonic() < deadline:
        alive = sum(1 for n in ray.nodes() if n["Alive"])
        if alive >= count:
            return
        time.sleep(1.0)
    raise SlurmError(
        f"{alloc.describe()}: {alive} of {count} nodes joined the job's Ray within {timeout_s:g} s: see the nodes' "
        "logs in the run directory's logs/nodes/"
    )


# the head this process started (in a run: placement.start_ray starts it, placement.stop_ray stops it)
_HEAD: RayNode | None = None


def start_job_head(alloc: Allocation, log_dir: Path) -> str:
    """In a run of rank 0: start the job's Ray head on this node (token auth put into this process's environment,
    so the driver connects with it); returns its address. `stop_job_head()` ends it."""
    global _HEAD
    os.environ.update(auth_env(alloc))  # before the head starts: it and the driver use one token
    _HEAD = RayNode(alloc, head=True, log_dir=log_dir)
    _HEAD.wait_until_up()
    return head_address(alloc)


def stop_job_head() -> None:
    global _HEAD
    head, _HEAD = _HEAD, None
    if head is not None:
        head.stop()


def serve_worker(alloc: Allocation, log_dir: Path) -> int:
    """A rank > 0 of the job step: this node joins the head as a worker until the head goes (or `.stop` appears)."""
    wait_for_head(alloc)
    return serve_node(RayNode(alloc, head=False, log_dir=log_dir))


def wait_for_head(alloc: Allocation, timeout_s: float = HEAD_TIMEOUT_S) -> str:
    """Until the head's port answers (a worker's `ray start` would give up on a head still starting); its address."""
    address = head_address(alloc)
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while port_free(int(port), host):
        if time.monotonic() > deadline:
            raise SlurmError(
                f"{alloc.describe()}: the Ray head at {address} did not come up within {timeout_s:g} s: see the "
                "nodes' logs in the run directory's logs/nodes/"
            )
        time.sleep(0.5)
    return address


def record_sigterm(log_dir: Path) -> list[float]:
    """From now on a SIGTERM to this process is not fatal: the first writes <log dir>/.terminated at once. Returns the
    list that then holds its time (time.monotonic())."""
    log_dir.mkdir(parents=True, exist_ok=True)
    received: list[float] = []

    def record(signum: int, frame: object) -> None:
        if not received:
            received.append(time.monotonic())
            (log_dir / TERM_FILE).write_text(f"{socket.gethostname()}: SIGTERM\n")

    signal.signal(signal.SIGTERM, record)
    return received


def serve_node(node: RayNode, received: Sequence[float] = (), grace_s: float = STOP_GRACE_S) -> int:
    """This node's Ray until it ends by itself or `.stop` appears, or `grace_s` after the SIGTERM that `received`
    (record_sigterm's list) holds; then stopped. Returns 143 after a SIGTERM, else 0."""
    stop_file = node.log_dir / STOP_FILE
    try:
        while node.proc.poll() is None and not stop_file.exists():
            if received and time.monotonic() - received[0] >= grace_s:
                break
            time.sleep(0.5)
    finally:
        node.stop()
    return 143 if received else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.runtime.slurm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node", help="this node's part of the job's Ray (head on rank 0), until <log-dir>/.stop")
    node.add_argument("--log-dir", type=Path, required=True)
    node.add_argument(
        "--worker", action="store_true", help="join the head whatever this task's rank (it runs elsewhere)"
    )
    wait = sub.add_parser("wait", help="print the head's address once every node of the allocation has joined")
    wait.add_argument("--timeout", type=float, default=HEAD_TIMEOUT_S)
    args = parser.parse_args(argv)
    alloc = Allocation.from_env()
    if alloc is None:
        print("error: not inside a SLURM job (no SLURM_JOB_ID): run this from a batch script", file=sys.stderr)
        return 2
    try:
        if args.command == "node":
            received = record_sigterm(args.log_dir)  # before Ray starts: a stop never leaves it without its owner
            head = alloc.rank == 0 and not args.worker
            if not head:
                wait_for_head(alloc)
            return 143 if received else serve_node(RayNode(alloc, head=head, log_dir=args.log_dir), received)
        deadline = time.monotonic() + args.timeout
        address = wait_for_head(alloc, args.timeout)
        import ray

        os.environ.update(auth_env(alloc))
        ray.init(address=address, configure_logging=False, log_to_driver=False)
        try:
            wait_for_nodes(len(alloc.hosts), alloc, max(deadline - time.monotonic(), 1.0))
        finally:
            ray.shutdown()
        print(address, flush=True)
        return 0
    except SlurmError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
