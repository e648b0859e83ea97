"""cluster.rollout_mode=continuous end to end: train.py on a real local Ray with a real vLLM CPU engine and a PEFT
learner (the tiny random model): samples are generated in segments while the learner trains, some continue across
an adapter update (their tokens carry two versions), and no trained sample is older than the bound."""

from __future__ import annotations

import pytest

from tests.helpers import jsonl, metric_rows, run_train
from tests.integration.test_train_ray import TINY_RUN

pytestmark = pytest.mark.slow

BOUND = 1


def test_continuous_rollouts_continue_across_updates_within_the_bound(tiny_model, tmp_path):
    out = tmp_path / "run"
    drop = ("run.steps", "eval.size", "model.max_new_tokens", "algorithm.group_size", "run.prompts_per_step")
    args = [a for a in TINY_RUN if not a.startswith(drop)]
    proc = run_train(
        [
            f"model.path={tiny_model}",
            f"run.output_dir={out}",
            "cluster=1a1l",
            *args,
            "run.steps=6",
            "eval.size=0",
            "cluster.rollout_mode=continuous",
            f"cluster.staleness={BOUND}",
            # one token per segment and few samples a step: generation (an actor call per token) outlasts a
            # learner step, so the syncs land while samples are in progress
            "run.prompts_per_step=1",
            "algorithm.group_size=2",
            "model.max_new_tokens=96",
            "cluster.segment_tokens=1",
            "algorithm.tis_cap=2.0",
            "logger.rollouts_interval=1",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in metric_rows(out, timings=True) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert all(r["async/staleness_max"] <= BOUND for r in steps)
    assert all(sum(r[f"async/lag_{k}"] for k in range(BOUND + 1)) == 2 for r in steps)  # 1 prompt x 2 samples
    assert sum(r["async/segments_continued"] for r in steps) > 0
    assert all(r["perf/samples_per_s"] > 0 and 0 <= r["perf/actor_idle_frac"] <= 1 for r in steps)
    # the rollout dumps: per-token versions; some sample holds tokens of two adapter versions, none is too old
    spanning = 0
    for r in steps:
        rows = jsonl(out / "rollouts" / f"step_{r['step']:04d}.jsonl")
        current = r["sync/version"] - 1  # the version the learner trained this step from
        for row in rows:
            versions = [span["version"] for span in row["versions"]]
            assert current - min(versions) <= BOUND
            spanning += len(set(versions)) > 1
    assert spanning > 0 and spanning == sum(r["async/partial_rollouts"] for r in steps)
