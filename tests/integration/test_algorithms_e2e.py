"""Every algorithm bundle trains end to end (2 steps, tiny model, in-process HF rollout: no Ray, no vLLM)."""

from __future__ import annotations

import pytest

from tests.helpers import REPO, metric_rows, run_train, tiny_args

pytestmark = pytest.mark.slow

BUNDLES = sorted(p.stem for p in (REPO / "conf" / "algorithm").glob("*.yaml"))


@pytest.mark.parametrize("bundle", BUNDLES)
def test_bundle_runs_two_steps(bundle, tiny_model, tmp_path):
    out = tmp_path / bundle
    # a random tiny model never stops before max_new_tokens: every answer is truncated, and DAPO's truncated-
    # response mask would (correctly) leave nothing to learn from; keep the rest of its recipe
    extra = ["algorithm.filter_truncated_response=false"] if bundle == "dapo" else []
    proc = run_train(
        [
            *extra,
            f"algorithm={bundle}",
            *tiny_args(tiny_model),
            f"run.output_dir={out}",
            "run.steps=2",
            "run.prompts_per_step=2",
            "algorithm.group_size=4",
            "eval.size=2",
            "model.max_new_tokens=8",
            "logger=none",
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metric_rows(out, timings=True)
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["train/skipped_nonfinite"] == 0.0
        assert r["train/samples_with_signal"] > 0
        assert 0.0 < r["policy/ratio_mean"] < 10.0
        assert r["train/grad_norm"] > 0
    assert steps[-1]["sync/version"] == 2.0


def test_kl_folded_into_the_reward(tiny_model, tmp_path):
    out = tmp_path / "kl_in_reward"
    proc = run_train(
        [
            "algorithm=grpo",
            "algorithm.kl_in_reward=true",
            "algorithm.kl_coef=0.5",
            *tiny_args(tiny_model),
            f"run.output_dir={out}",
            "run.steps=2",
            "run.prompts_per_step=2",
            "algorithm.group_size=4",
            "eval.size=0",
            "model.max_new_tokens=8",
            "logger=none",
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = metric_rows(out, timings=True)
    # step 1 samples come from the base model: KL to the reference is 0; after one update it is positive
    assert steps[0]["reward/kl_penalty_mean"] == pytest.approx(0.0, abs=1e-4)
    assert steps[1]["reward/kl_penalty_mean"] > 0
    assert all("policy/kl_ref" not in r for r in steps)  # not also in the loss
