"""`logger=wandb logger.mode=offline` writes a wandb offline run directory (no account, no network) holding the
run's history and, with `logger.rollouts_interval`, each dumped step's samples as a wandb Table, beside
metrics.jsonl (tiny model, in-process HF rollout, 1 step)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import jsonl, metric_rows, run_train, tiny_args

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
            "logger.rollouts_interval=1",
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
    # the step's samples as the wandb Table `rollouts`, read back from the offline run: the dump's rows
    tables = list(runs[0].glob("files/media/table/rollouts_*.table.json"))
    assert len(tables) == 1, sorted(p.name for p in runs[0].rglob("*") if p.is_file())
    table = json.loads(tables[0].read_text())
    dump = jsonl(out / "rollouts" / "step_0001.jsonl")
    assert len(dump) == 4 and table["columns"][: len(dump[0])] == list(dump[0])
    assert [dict(zip(table["columns"], row)) for row in table["data"]] == dump
