"""The SLURM side without a SLURM (rl/runtime/slurm.py, the slurm launcher): what a job reads from its allocation,
the per-job ports and temp dir, the one-line errors (no sbatch on the PATH, GPUs the allocation lacks, a Ray head that
does not come up in time), plan=true reading the allocation, and a node process and a run getting the scheduler's
SIGTERM. The real SLURM runs are in
tests/integration/test_slurm.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rl import entry
from rl.config.schema import TrainConfig
from rl.preflight import plan
from rl.runtime import slurm
from tests.helpers import QWEN_05B, REPO, repo_env

JOB = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_CPUS_ON_NODE": "16",
    "CUDA_VISIBLE_DEVICES": "2,3",
    "SLURM_MEM_PER_NODE": "64000",
}


def test_the_allocation_is_read_from_slurms_environment():
    job = slurm.Allocation.from_env(JOB)
    assert job == slurm.Allocation("4242", ("gpu07", "gpu08"), 1, 2, 0, 16, 2, 64000)
    assert job.gpus_total == 4 and job.describe() == "SLURM job 4242 (2 node(s) x 16 CPUs, 2 GPU(s))"
    assert slurm.Allocation.from_env({"PATH": "/bin"}) is None  # outside a job
    only_count = {k: v for k, v in JOB.items() if k != "CUDA_VISIBLE_DEVICES"} | {"SLURM_GPUS_ON_NODE": "4"}
    assert slurm.Allocation.from_env(only_count).gpus == 4
    assert slurm.hostnames("a[1-3,05],b7") == ["a1", "a2", "a3", "a05", "b7"]


def test_each_job_has_ports_and_a_temp_dir_of_its_own():
    a, b = slurm.job_ports("4242"), slurm.job_ports("4243")
    assert len(set(a.values())) == len(a) and not set(a.values()) & set(b.values())
    assert all(20000 <= p < 60000 for p in (*a.values(), *b.values()))  # above Ray's worker ports (10002-19999)
    assert slurm.job_ports("4242") == a  # every node of the job computes the same
    assert slurm.temp_dir("4242") != slurm.temp_dir("4243") and len(str(slurm.temp_dir("4242_17"))) < 40
    command = slurm.ray_start_command(replace(slurm.Allocation.from_env(JOB), hosts=("localhost",)), head=True)
    assert "--num-cpus=16" in command and "--num-gpus=2" in command and f"--port={a['gcs']}" in command
    assert f"--temp-dir={slurm.temp_dir('4242')}" in command
    assert f"--object-store-memory={int(64000 * 0.3 * 2**20)}" in command  # inside the job's memory


def test_an_allocation_without_the_gpus_of_the_layout_is_one_line():
    job = slurm.Allocation.from_env(JOB)
    slurm.check_gpus(job, 4, 1)  # fits
    with pytest.raises(slurm.SlurmError) as e:
        slurm.check_gpus(job, 5, 1)
    assert "SLURM job 4242 (2 node(s) x 16 CPUs, 2 GPU(s)) has 4 GPU(s) and the layout needs 5" in str(e.value)
    assert "hydra.launcher.gpus_per_node" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(slurm.SlurmError, match="one role needs 4 GPUs on one node and a node has 2"):
        slurm.check_gpus(job, 4, 4)


def test_a_head_that_does_not_come_up_is_one_line_and_stopped(tmp_path):
    job = replace(slurm.Allocation.from_env(JOB), job_id="3999", hosts=("localhost",), rank=0, step_nodes=1)
    never = [sys.executable, "-c", "import time; print('starting', flush=True); time.sleep(60)"]
    node = slurm.RayNode(job, head=True, log_dir=tmp_path, command=never)
    with pytest.raises(slurm.SlurmError) as e:
        node.wait_until_up(timeout_s=1)
    message = str(e.value)
    assert message.startswith("SLURM job 3999 (1 node(s) x 16 CPUs, 2 GPU(s)): the Ray head at 127.0.0.1:")
    assert f"did not come up within 1 s: see {tmp_path / node.host}.log (starting)" in message
    assert node.proc.poll() is not None  # stopped


def test_no_sbatch_on_the_path_is_one_line(tmp_path):
    env = repo_env(PATH=str(Path(sys.executable).parent), HYDRA_FULL_ERROR="0")  # this Python, no SLURM commands
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", "run.seed=0,1", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path}"],
        cwd=REPO,
        env={k: v for k, v in env.items() if not k.startswith("SLURM_")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("error: hydra/launcher=slurm submits each job with sbatch, which is not on the PATH")
    )
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no job submitted (Hydra wrote only multirun.yaml)


def test_plan_reads_the_allocation(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(__import__("json").dumps(QWEN_05B))
    for key, value in JOB.items():
        monkeypatch.setenv(key, value)
    cfg = TrainConfig()
    cfg.model.path = str(tmp_path)
    cfg.cluster = replace(cfg.cluster, use_gpu=True, num_actors=4)
    text, warnings = plan.format_plan(cfg)
    assert "need 5 (4 actor(s) x 1 + 1 learner(s) x 1); available: 4 in SLURM job 4242" in text
    assert warnings[0].startswith("the roles need 5 GPUs, at most 1 on one node, and SLURM job 4242")
    cfg.cluster = replace(cfg.cluster, num_actors=3)
    assert not [w for w in plan.format_plan(cfg)[1] if "SLURM" in w]
    assert os.environ["SLURM_JOB_ID"] == "4242"


# a node process (as `python -m rl.runtime.slurm node` runs it) whose "Ray" is a sleeping Python in its own session
SERVE_NODE = """
import os, sys
from pathlib import Path
from rl.runtime import slurm
alloc = slurm.Allocation(f"unit{os.getpid()}", ("localhost",), 1, 1, 0, 1, 0, None)
log_dir = Path(sys.argv[1])
received = slurm.record_sigterm(log_dir)
node = slurm.RayNode(alloc, head=False, log_dir=log_dir, command=[sys.executable, "-c", "import time; time.sleep(600)"])
print(node.proc.pid, flush=True)
sys.exit(slurm.serve_node(node, received, grace_s=float(sys.argv[2])))
"""


def wait_for(condition, what: str) -> None:
    for _ in range(600):
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"still not {what} after 60 s")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def node_process(tmp_path):
    """Start SERVE_NODE with a grace time; yields (process, its Ray's pid); stops both if the test did not."""
    started = []

    def start(grace_s: float) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE_NODE, str(tmp_path), str(grace_s)],
            cwd=REPO,
            env=repo_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        ray_pid = int(proc.stdout.readline())
        started.append(ray_pid)
        return proc, ray_pid

    yield start
    for item in started:
        if isinstance(item, subprocess.Popen):
            item.kill()
            item.wait()
        elif alive(item):
            os.killpg(item, signal.SIGKILL)


def test_a_node_process_told_to_stop_records_it_and_keeps_its_ray_until_train_py_ends(tmp_path, node_process):
    proc, ray_pid = node_process(grace_s=600)
    proc.send_signal(signal.SIGTERM)  # SLURM's stop; Ray, in its own session, is not signalled here
    wait_for(lambda: (tmp_path / slurm.TERM_FILE).is_file(), "recorded")
    assert proc.poll() is None and alive(ray_pid)  # Ray stays for train.py's teardown
    (tmp_path / slurm.STOP_FILE).touch()  # what slurm/rlft.sbatch does once train.py has ended
    assert proc.wait(timeout=60) == 143
    assert not alive(ray_pid)


def test_a_node_process_stops_its_ray_after_the_grace_time_without_waiting_for_train_py(tmp_path, node_process):
    proc, ray_pid = node_process(grace_s=0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert (tmp_path / slurm.TERM_FILE).is_file() and not (tmp_path / slurm.STOP_FILE).exists()
    assert not alive(ray_pid)


def test_a_node_process_ends_with_its_ray_and_without_a_record_when_not_signalled(tmp_path, node_process):
    proc, ray_pid = node_process(grace_s=600)
    os.killpg(ray_pid, signal.SIGTERM)  # Ray went down by itself (or SLURM signalled it directly)
    assert proc.wait(timeout=60) == 0
    assert not (tmp_path / slurm.TERM_FILE).exists()


def test_a_nodes_ray_ignores_the_time_limits_sigusr2(node_process):
    """SLURM's warning before the time limit (hydra/launcher=slurm) goes to every process of the step; Ray's own
    processes inherit the ignored SIGUSR2 from the one the node starts."""
    _, ray_pid = node_process(grace_s=600)
    # The pid is known at fork: wait until the shell, its trap set, has exec'd the node's own command.
    command = f"{sys.executable}\0-c\0import time; time.sleep(600)\0".encode()
    wait_for(lambda: Path(f"/proc/{ray_pid}/cmdline").read_bytes() == command, "started its command")
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{ray_pid}/status").read_text().splitlines())
    assert int(status["SigIgn"], 16) & (1 << (signal.SIGUSR2 - 1))


def test_the_first_sigterm_interrupts_a_run_and_a_repeated_one_leaves_its_teardown_alone(monkeypatch):
    monkeypatch.setattr(entry, "_stop_requested", False)
    assert not entry.stop_requested()
    with pytest.raises(KeyboardInterrupt):
        entry.on_sigterm(signal.SIGTERM, None)
    assert entry.stop_requested()
    entry.on_sigterm(signal.SIGTERM, None)  # a second SIGTERM, during the teardown
