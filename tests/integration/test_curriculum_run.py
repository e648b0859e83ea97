"""A curriculum through train.py (tiny model, in-process HF rollout: no Ray, no vLLM): `curriculum=pass_rate` on a
training set small enough that prompts repeat skips prompts and logs its metrics, its state is in the checkpoints,
and 6 steps straight equal 3 steps + `run.resume=auto` + 3 steps bit for bit (staleness 0: nothing in flight)."""

from __future__ import annotations

import pickle

import pytest

from tests.helpers import metric_rows, run_train
from tests.integration.test_resume import args

pytestmark = pytest.mark.slow

CURRICULUM = (
    "curriculum=pass_rate",
    "env.size=4",  # 4 training prompts, 2 per step: every prompt comes back every other step
    "eval.size=2",
    "eval.correct_threshold=0.05",  # LengthReward: some samples of a prompt pass, some do not
    "curriculum.solved=0.5",
    "curriculum.revisit_prob=0.2",
    "checkpoint.interval=1",
)


def test_pass_rate_curriculum_skips_logs_checkpoints_and_resumes_exactly(tiny_model, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    proc = run_train(args(tiny_model, straight, "run.steps=6", *CURRICULUM))
    assert proc.returncode == 0, proc.stderr[-3000:]
    full = metric_rows(straight)
    assert all("curriculum/pass_rate_1" in r for r in full if "reward/mean" in r)
    assert sum(r.get("curriculum/skipped", 0) for r in full) > 0  # something was solved and skipped
    state = pickle.loads((straight / "checkpoints" / "step_0006" / "trainer.pkl").read_bytes())
    assert state["data"]["curriculum"]["kind"] == "pass_rate" and state["data"]["curriculum"]["rates"]

    proc = run_train(args(tiny_model, resumed, "run.steps=3", *CURRICULUM))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_train(args(tiny_model, resumed, "run.steps=6", "run.resume=auto", *CURRICULUM))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    train = lambda run: [r for r in metric_rows(run) if "train/loss" in r]  # noqa: E731
    assert [r["step"] for r in train(resumed)] == [1, 2, 3, 4, 5, 6]
    assert train(resumed) == train(straight)  # the same prompts chosen and skipped, the same samples and losses
    adapter = "adapter/adapter_model.safetensors"
    assert (resumed / adapter).read_bytes() == (straight / adapter).read_bytes()
