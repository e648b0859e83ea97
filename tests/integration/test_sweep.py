"""`python train.py -m ...` runs every job of a sweep, each in its own run directory, Ray started and stopped per job.
A sweep's summary files and wandb group are checked by the in-process sweep of every algorithm bundle
(test_algorithms_e2e.py), hydra/launcher=ray_cluster on a running cluster by test_multinode.py."""

from __future__ import annotations

import pytest

from tests.helpers import metric_rows, run_train, tiny_args

pytestmark = [pytest.mark.slow, pytest.mark.tier2]


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
