"""`python train.py -m ...` runs every job of a sweep, each in its own run directory, Ray started and stopped per job."""

from __future__ import annotations

import csv

import pytest

from tests.helpers import metric_rows, run_train, tiny_args

pytestmark = pytest.mark.slow


def test_multirun_sweeps_algorithms_on_ray(tiny_model, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_train(
        [
            "-m",
            "algorithm=grpo,pg",
            *tiny_args(tiny_model, in_process=False),
            "cluster.rollout_backend=hf",
            "run.steps=1",
            "run.prompts_per_step=2",
            "algorithm.group_size=4",
            "eval.size=2",
            "model.max_new_tokens=8",
            "logger=none",
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job, algo in (("0", "grpo"), ("1", "pg")):
        rows = metric_rows(sweep / job, timings=True)
        assert [r["step"] for r in rows if "train/loss" in r] == [1]
        assert (sweep / job / "adapter" / "adapter_model.safetensors").is_file()
        assert f"algorithm {algo};" in proc.stdout


def wandb_history(job_dir) -> bytes:
    """The binary history of a job's offline wandb run (what `wandb sync` uploads)."""
    (history,) = job_dir.glob("wandb/offline-run-*/run-*.wandb")
    return history.read_bytes()


def test_sweep_summary_and_wandb_group(tiny_model, tmp_path):
    """4 in-process jobs (algorithm x seed): one run dir each, sweep_summary.{csv,md,png} from the Hydra callback,
    every job's offline wandb run in the group named by the sweep directory."""
    sweep = tmp_path / "sweep"
    proc = run_train(
        [
            "-m",
            "algorithm=grpo,dapo",
            "run.seed=0,1",
            *tiny_args(tiny_model),
            "run.steps=2",
            "run.prompts_per_step=2",
            "algorithm.group_size=4",
            "eval.size=2",
            "checkpoint.interval=0",
            "model.max_new_tokens=8",
            "logger=wandb",
            "logger.mode=offline",
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (sweep / "sweep_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["overrides"]) for r in rows] == [
        ("0", "algorithm=grpo run.seed=0"),
        ("1", "algorithm=grpo run.seed=1"),
        ("2", "algorithm=dapo run.seed=0"),
        ("3", "algorithm=dapo run.seed=1"),
    ]
    for r in rows:
        assert r["status"] == "done" and r["steps"] == "2", r
        for key in ("rollout_tokens_per_s", "step_s", "sync_s"):
            assert float(r[key]) > 0, (key, r)
        # DAPO masks truncated responses out of the loss, and 8 tokens truncate every one here: 0 tokens learned
        assert (
            float(r["learner_tokens_per_s"]) > 0 if "grpo" in r["overrides"] else float(r["learner_tokens_per_s"]) >= 0
        )
        for key in ("actor_idle_frac", "learner_idle_frac", "final_reward", "eval_accuracy"):
            assert 0 <= float(r[key]) <= 1, (key, r)
    assert (sweep / "sweep_summary.md").read_text().count("\n| ") == 1 + 4
    assert (sweep / "sweep_summary.png").read_bytes().startswith(b"\x89PNG")
    # RunRecord.run_group is protobuf field 6, a string: tag byte 0x32, its length (a varint), its bytes. The
    # sweep path also appears in other fields (the run dir), so the tag is what proves it is the group.
    group = str(sweep).encode()
    assert len(group) < 128, "the length must fit a one-byte varint for this check"
    for job in ("0", "1", "2", "3"):
        assert b"\x32" + bytes([len(group)]) + group in wandb_history(sweep / job), f"job {job}: group is not {sweep}"


def test_ray_launcher_runs_the_sweep_as_ray_tasks(tiny_model, tmp_path):
    """hydra/launcher=ray_cluster (conf/hydra/launcher/ray_cluster.yaml: hydra-ray-launcher joining a running
    cluster); here address=null makes the launcher start a local Ray, stopped when train.py exits."""
    sweep = tmp_path / "sweep"
    proc = run_train(
        [
            "-m",
            "hydra/launcher=ray_cluster",
            "hydra.launcher.ray.init.address=null",
            "+hydra.launcher.ray.init.num_cpus=2",
            "algorithm=grpo,pg",
            *tiny_args(tiny_model),
            "run.steps=1",
            "run.prompts_per_step=2",
            "algorithm.group_size=2",
            "eval.size=2",
            "checkpoint.interval=0",
            "model.max_new_tokens=4",
            "logger=none",
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Ray Launcher is launching 2 jobs" in proc.stdout + proc.stderr
    assert "(_run_job pid=" in proc.stdout + proc.stderr  # the jobs ran inside Ray tasks, not in this process
    for job in ("0", "1"):
        steps = [r["step"] for r in metric_rows(sweep / job, timings=True)]
        assert steps == [0, 1, 1]  # eval before, the training step, eval after
        assert (sweep / job / "summary.json").is_file()
    with (sweep / "sweep_summary.csv").open() as f:
        assert [r["overrides"] for r in csv.DictReader(f)] == ["algorithm=grpo", "algorithm=pg"]
