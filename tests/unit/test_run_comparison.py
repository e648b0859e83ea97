"""The helper the reproducibility tests (CPU and GPU) compare two runs with: run folders written here by hand, so that
what it accepts and refuses is checked without the minutes a real pair of runs takes (the GPU's repeat part can only
run on a GPU machine, and a wrong comparison there costs a device session to find)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_same_first_steps


def fake_run(root: Path, steps: int, *, reward_at_1: float = 0.25, final_accuracy: float = 0.5) -> Path:
    """A run folder as train.py leaves it with checkpoint.interval=1 and logger.rollouts_interval=1: metrics rows
    (the evaluation before training, one training row per step with its durations, the evaluation after the last),
    each step's adapter and rollout dump, the evaluation dump before training."""
    rows = [{"step": 0, "eval/accuracy": 0.25, "eval/n": 4.0, "time/eval_s": 1.0}]
    for step in range(1, steps + 1):
        reward = reward_at_1 if step == 1 else 0.5
        rows.append(
            {
                "step": step,
                "train/loss": 0.1 * step,
                "reward/std": 0.3,
                "reward/mean": reward,
                "time/step_s": step * 1.7,
            }
        )
        (root / f"checkpoints/step_{step:04d}/adapter").mkdir(parents=True)
        (root / f"checkpoints/step_{step:04d}/adapter/adapter_model.safetensors").write_bytes(bytes([step]) * 64)
        (root / "rollouts").mkdir(exist_ok=True)
        (root / f"rollouts/step_{step:04d}.jsonl").write_text(
            json.dumps({"step": step, "text": f"sample {step}"}) + "\n"
        )
    rows.append({"step": steps, "eval/accuracy": final_accuracy, "eval/n": 4.0, "time/eval_s": 2.5})
    (root / "eval").mkdir(parents=True, exist_ok=True)
    (root / "eval/step_0000.jsonl").write_text(json.dumps({"prompt": "p", "completion": "c"}) + "\n")
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_two_runs_of_the_same_length_compare_equal(tmp_path):
    """The GPU's repeat part compares two 2-step runs: both end with an evaluation at step 2, which both leave out."""
    assert_same_first_steps(fake_run(tmp_path / "a", 2), fake_run(tmp_path / "b", 2), steps=2)


def test_a_longer_run_compares_with_a_shorter_one_up_to_its_end(tmp_path):
    """The CPU test compares a 3-step run with a 2-step one: the 2-step run's final evaluation is not compared."""
    assert_same_first_steps(fake_run(tmp_path / "a", 3, final_accuracy=0.75), fake_run(tmp_path / "b", 2), steps=2)


def test_a_different_training_row_fails(tmp_path):
    with pytest.raises(AssertionError):
        assert_same_first_steps(fake_run(tmp_path / "a", 2), fake_run(tmp_path / "b", 2, reward_at_1=0.3), steps=2)


def test_a_different_adapter_fails(tmp_path):
    a, b = fake_run(tmp_path / "a", 2), fake_run(tmp_path / "b", 2)
    (b / "checkpoints/step_0002/adapter/adapter_model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(AssertionError, match="adapters differ at step 2"):
        assert_same_first_steps(a, b, steps=2)
