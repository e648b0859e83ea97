"""The SLURM side without a SLURM (rl/runtime/slurm.py, the slurm launcher): what a job reads from its allocation,
the per-job ports and temp dir, the one-line errors (no sbatch on the PATH, GPUs the allocation lacks, a Ray head that
does not come up in time), and plan=true reading the allocation. The real SLURM runs are in
tests/integration/test_slurm.py."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

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
    import subprocess

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
