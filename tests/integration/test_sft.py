"""A supervised warm start, then RL from its adapter, through train.py: `algorithm=sft` on demonstrations that
`python -m rl.tools.demos` wrote lowers its loss and writes an adapter, and an RL run with
`model.init_adapter=<that run>` starts from it (its evaluation before training is the warm start's after).
Tiny model, in-process HF generation (one process, greedy evaluation is the same on both runs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, jsonl, metric_rows, run_train, tiny_args

pytestmark = pytest.mark.slow


def test_sft_lowers_its_loss_and_an_rl_run_starts_from_its_adapter(tiny_model, tmp_path):
    demos = tmp_path / "demos.jsonl"
    cmd = [sys.executable, "-m", "rl.tools.demos", "env=calc_products", "--n", "8", "--out", str(demos)]
    made = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    common = [*tiny_args(tiny_model), "env=calc_products", "eval.size=4", "run.prompts_per_step=4"]
    sft = tmp_path / "sft"
    proc = run_train(
        [
            *common,
            "algorithm=sft",
            f"algorithm.demos={demos}",
            "algorithm.lr=5e-3",
            "run.steps=4",
            f"run.output_dir={sft}",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["train/loss"] for r in metric_rows(sft) if "train/loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0]  # the demonstrations' cross-entropy falls
    rows = [r for r in metric_rows(sft) if "sft/demos" in r]
    assert rows and all(r["sft/demos"] == 4 and r["sft/env_tokens_mean"] > 0 for r in rows)  # tool results masked
    assert (sft / "adapter" / "adapter_model.safetensors").is_file()
    summary = json.loads((sft / "summary.json").read_text())
    assert summary["data/demos"] == 8 and summary["data/dropped_long_demos"] == 0

    rl = tmp_path / "rl"
    proc = run_train(
        [*common, f"model.init_adapter={sft}", "algorithm.group_size=2", "run.steps=1", f"run.output_dir={rl}"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    before_sft, after_sft = jsonl(sft / "eval" / "step_0000.jsonl"), jsonl(sft / "eval" / "step_0004.jsonl")
    start_rl = jsonl(rl / "eval" / "step_0000.jsonl")
    completions = lambda rows: [r["completion"] for r in rows]  # noqa: E731
    assert completions(start_rl) == completions(after_sft) != completions(before_sft)  # the warm start, not the base
    assert json.loads((rl / "summary.json").read_text())["sync/probe_floor"] < 0.05  # the actor serves it too
