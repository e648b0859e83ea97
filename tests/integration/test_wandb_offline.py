"""`logger=wandb logger.mode=offline` writes a wandb offline run directory (no account, no network) holding the
run's history, beside metrics.jsonl (tiny model, in-process HF rollout, 1 step)."""

from __future__ import annotations

import pytest

from tests.helpers import metric_rows, run_train, tiny_args

pytestmark = pytest.mark.slow


def test_wandb_offline_run_directory(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_train(
        [
            *tiny_args(tiny_model),
            f"run.output_dir={out}",
            "run.steps=1",
            "run.prompts_per_step=2",
            "algorithm.group_size=2",
            "eval.size=0",
            "checkpoint.interval=0",
            "model.max_new_tokens=4",
            "logger=wandb",
            "logger.mode=offline",
            "logger.project=rlft-test",
            "logger.tags=[resume,offline]",
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((out / "wandb").iterdir()) if (out / "wandb").exists() else "no wandb folder"
    history = list(runs[0].glob("run-*.wandb"))
    assert history and history[0].stat().st_size > 0  # the binary history file wandb sync would upload
    assert not (out / "checkpoints").exists()  # save_interval=0: no checkpoints
    steps = [r["step"] for r in metric_rows(out, timings=True)]
    assert steps == [1]
