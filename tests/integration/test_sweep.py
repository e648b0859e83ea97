"""`python train.py -m ...` runs every job of a sweep, each in its own run directory, Ray started and stopped per job."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_train, tiny_args

pytestmark = pytest.mark.slow


def test_multirun_sweeps_algorithms_on_ray(tiny_model, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_train(
        [
            "-m",
            "algorithm=grpo,pg",
            *tiny_args(tiny_model, in_process=False),
            "cluster.rollout_backend=hf",
            "steps=1",
            "prompts_per_step=2",
            "algorithm.group_size=4",
            "eval_size=2",
            "model.max_new_tokens=8",
            "logger=none",
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job, algo in (("0", "grpo"), ("1", "pg")):
        rows = [json.loads(line) for line in (sweep / job / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "train/loss" in r] == [1]
        assert (sweep / job / "adapter" / "adapter_model.safetensors").is_file()
        assert f"algorithm {algo};" in proc.stdout
