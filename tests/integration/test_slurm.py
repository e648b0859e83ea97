"""Runs and sweeps on a real SLURM: Debian's slurm-wlm and munge, a one-node cluster on this machine (slurmctld and
slurmd on localhost, tests/slurm/start.sh), started once for the module and stopped by its fixture. Against it:
a 2-job sweep through hydra/launcher=slurm (each job its own Ray cluster in its allocation) trains both jobs and
writes the sweep summary; one run through slurm/rlft.sbatch trains and exits 0 with its node logs in the run
directory; a run stopped with `scancel --signal=TERM` in mid-run keeps its last whole checkpoint, requeues itself
and the requeued job resumes it to the end; and a run whose Ray gets the stop too (`--full`, as preemption signals
the batch step) is requeued all the same. No fake sbatch: the tests skip with one line where SLURM is not
installed (CI installs it: .ci/run)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY_RUN, check_trained, metric_rows, repo_env

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

# one actor and one learner on half a CPU each: a job fits the one CPU it asks for, so two jobs run side by side
RAY_ON_ONE_CPU = ["cluster.rollout_backend=hf", "cluster.cpus_per_actor=0.5", "cluster.cpus_per_learner=0.5"]
JOB_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def slurm_env():
    missing = [c for c in ("slurmctld", "slurmd", "munged", "sbatch") if shutil.which(c) is None]
    if missing:
        pytest.skip(f"SLURM not installed ({', '.join(missing)} missing): apt-get install -y slurm-wlm munge")
    state = Path(tempfile.mkdtemp(prefix="rlft-slurm-", dir="/tmp"))
    try:
        subprocess.run(["bash", str(REPO / "tests/slurm/start.sh"), str(state)], check=True, timeout=120)
        yield repo_env(SLURM_CONF=str(state / "slurm.conf"), HYDRA_FULL_ERROR="0")
    finally:
        subprocess.run(["bash", str(REPO / "tests/slurm/stop.sh"), str(state)], timeout=120)
        shutil.rmtree(state, ignore_errors=True)


def job_state(job: str, env: dict) -> str:
    out = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True)
    fields = dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)
    return fields.get("JobState", "UNKNOWN")


def cluster_logs(env: dict, job: str, lines: int = 40) -> str:
    """The job's record and the tails of the test cluster's slurmctld and slurmd logs (its folder goes with the
    fixture): why SLURM failed a job that wrote nothing to its output."""
    state = Path(env["SLURM_CONF"]).parent
    record = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True).stdout
    tails = [
        f"--- {name}\n" + "\n".join((state / name).read_text(errors="replace").splitlines()[-lines:])
        for name in ("slurmctld.log", "slurmd.log")
        if (state / name).is_file()
    ]
    return "\n".join([record, *tails])


def wait_job(job: str, env: dict, states: tuple[str, ...], log: Path) -> str:
    for _ in range(JOB_TIMEOUT_S):
        state = job_state(job, env)
        if state in states:
            return state
        time.sleep(1)
    subprocess.run(["scancel", job], env=env)
    pytest.fail(f"job {job} still {job_state(job, env)} after {JOB_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def sbatch(env: dict, run_dir: Path, log: Path, *overrides: str) -> str:
    job_env = dict(env, RLFT_PYTHON=sys.executable, RLFT_RUN_DIR=str(run_dir))  # this checkout has no .venv
    out = subprocess.run(
        ["sbatch", "--parsable", f"--output={log}", "--cpus-per-task=1", "slurm/rlft.sbatch", *overrides],
        cwd=REPO,
        env=job_env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


def test_sweep_through_the_slurm_launcher(slurm_env, tiny_model, tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "run.seed=0,1",
            "hydra/launcher=slurm",
            "hydra.launcher.cpus_per_task=1",
            f"hydra.sweep.dir={sweep}",
            f"model.path={tiny_model}",
            *TINY_RUN,
            *RAY_ON_ONE_CPU,
            "logger=none",
        ],
        cwd=REPO,
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job in ("0", "1"):
        check_trained(sweep / job)
        # the job's own Ray: its head's output and Ray's session logs of this node, and nothing left in /tmp
        (node_log,) = (sweep / job / "logs" / "nodes").glob("*.log")
        assert "Ray runtime started" in node_log.read_text()
    assert "sweep summary:" in proc.stdout
    rows = (sweep / "sweep_summary.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",done," in r for r in rows[1:])


def test_one_run_through_the_batch_script(slurm_env, tiny_model, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "slurm.out"
    job = sbatch(slurm_env, run_dir, log, f"model.path={tiny_model}", *TINY_RUN, *RAY_ON_ONE_CPU, "logger=none")
    assert wait_job(job, slurm_env, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), log) == "COMPLETED", (
        log.read_text()[-3000:]
    )
    check_trained(run_dir)
    nodes = run_dir / "logs" / "nodes"
    assert "Ray runtime started" in next(nodes.glob("*.log")).read_text()
    assert any(p.name == "raylet.out" for p in nodes.rglob("raylet.out"))  # Ray's own logs of the node


def stop_in_mid_run(env: dict, run_dir: Path, log: Path, model: Path, *scancel: str) -> str:
    """Submit a 4-step run, `scancel --signal=TERM <scancel> <job>` once its first checkpoint is whole, and wait until
    the job is requeued (PENDING); returns the job's ID."""
    steps = ["run.steps=4", "checkpoint.interval=1"]
    job = sbatch(env, run_dir, log, f"model.path={model}", *TINY_RUN, *RAY_ON_ONE_CPU, *steps, "logger=none")
    first = run_dir / "checkpoints" / "step_0001"
    for _ in range(JOB_TIMEOUT_S):
        if first.is_dir() or job_state(job, env) not in ("PENDING", "RUNNING"):
            break
        time.sleep(0.5)
    assert first.is_dir(), log.read_text()[-3000:]
    subprocess.run(["scancel", "--signal=TERM", *scancel, job], env=env, check=True)
    wait_job(job, env, ("PENDING",), log)
    assert "summary.json" not in {p.name for p in run_dir.iterdir()}
    return job


def test_a_stopped_run_keeps_its_checkpoint_and_the_requeued_job_finishes_it(slurm_env, tiny_model, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "slurm.out"
    job = stop_in_mid_run(slurm_env, run_dir, log, tiny_model)
    # only train.py's step got the SIGTERM (the head's Ray runs in the batch step): it ends with its line and 130
    text = log.read_text()
    assert "interrupted: " in text and "stopped by SIGTERM (status 130); requeueing job" in text, text[-3000:]
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept and all(not n.startswith(".") for n in kept)  # whole checkpoints only, no temp folder left
    # SLURM holds a requeued job back for about two minutes before it may start again: let it start now
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=slurm_env, check=True)
    state = wait_job(job, slurm_env, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), log)
    assert state == "COMPLETED", log.read_text()[-2000:] + "\n" + cluster_logs(slurm_env, job)
    text = log.read_text()
    assert f"resumed from {run_dir / 'checkpoints' / kept[-1]}" in text, text[-3000:]
    rows = [r for r in metric_rows(run_dir) if "train/loss" in r]
    assert sorted({r["step"] for r in rows}) == [1, 2, 3, 4]
    assert (run_dir / "summary.json").is_file()


def test_a_run_whose_ray_is_stopped_with_it_is_requeued(slurm_env, tiny_model, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "slurm.out"
    # --full: the batch step too, so the head's Ray gets the SIGTERM and may end train.py before its own line
    job = stop_in_mid_run(slurm_env, run_dir, log, tiny_model, "--full")
    try:
        assert (run_dir / "logs" / "nodes" / ".terminated").is_file()  # the head's node process recorded the stop
        assert (run_dir / "checkpoints" / "step_0001").is_dir()  # a save cut short leaves only its temp folder
        assert "rlft: train.py was stopped by SIGTERM (status " in log.read_text(), log.read_text()[-3000:]
    finally:
        subprocess.run(["scancel", job], env=slurm_env, check=True)
