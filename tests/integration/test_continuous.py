"""cluster.rollout_mode=continuous end to end: train.py on a real local Ray with a real vLLM CPU engine and a PEFT
learner (the tiny random model): samples are generated in segments while the learner trains, some continue across
an adapter update (their tokens carry two versions), and no trained sample is older than the bound."""

from __future__ import annotations

import pytest

from tests.helpers import TINY_RUN, assert_continuous_run, run_train

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
    assert_continuous_run(out, steps=6, bound=BOUND, samples_per_step=2)  # 1 prompt x 2 samples
