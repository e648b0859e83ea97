"""env=code_tasks with reward=code_tests end to end: train.py runs 2 steps whose completions are scored in the
sandbox (one process, HF generation, the tiny random model: cheap)."""

from __future__ import annotations

import pytest

from tests.helpers import metric_rows, run_train

pytestmark = pytest.mark.slow


def test_two_steps_on_code_tasks_scored_in_the_sandbox(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_train(
        [
            f"model.path={tiny_model}",
            f"run.output_dir={out}",
            "model.dtype=float32",
            "model.learner_dtype=float32",
            "cluster=local",
            "cluster.rollout_backend=hf",
            "env=code_tasks",
            "env.size=16",
            "reward=code_tests",
            "sandbox.wall_s=3",
            "run.steps=2",
            "run.prompts_per_step=2",
            "algorithm.group_size=2",
            "eval.size=2",
            "model.max_new_tokens=8",
            "checkpoint.interval=0",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metric_rows(out, timings=True)
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # every completion went through the sandbox (a random model writes no working code: reward 0, no errors)
    assert all(r["reward/sandbox_s"] > 0 and r["reward/errors"] == 0 for r in steps)
    assert all(r["reward/mean"] == 0 for r in steps)
