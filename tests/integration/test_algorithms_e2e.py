"""Every algorithm bundle trains end to end (2 steps, tiny model, in-process HF rollout: no Ray, no vLLM), all of
them as the jobs of one `-m` sweep: one process, so the bundles cost their training and not an interpreter start
each. The same sweep shows a multirun's own outputs: one run directory per job, sweep_summary.{csv,md,png} from the
Hydra callback, and every job's offline wandb run in the group named by the sweep directory."""

from __future__ import annotations

import csv

import pytest
from omegaconf import OmegaConf

from tests.helpers import REPO, metric_rows, run_train, tiny_args

pytestmark = pytest.mark.slow

# The RL bundles. A supervised one (policy_loss sft) learns from demonstrations, not from these rewards, and one that
# distils (distill_coef > 0) needs a teacher engine beside the roles; each has an end-to-end test of its own
# (tests/integration/test_sft.py, test_judge_distill_e2e.py).
BUNDLES = sorted(
    p.stem
    for p in (REPO / "conf" / "algorithm").glob("*.yaml")
    if OmegaConf.load(p).get("policy_loss") != "sft" and not OmegaConf.load(p).get("distill_coef")
)


def wandb_history(job_dir) -> bytes:
    """The binary history of a job's offline wandb run (what `wandb sync` uploads)."""
    (history,) = job_dir.glob("wandb/offline-run-*/run-*.wandb")
    return history.read_bytes()


def test_every_bundle_trains_two_steps_in_one_sweep(tiny_model, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_train(
        [
            "-m",
            f"algorithm={','.join(BUNDLES)}",
            # a random tiny model never stops before max_new_tokens: every answer is truncated, and DAPO's truncated-
            # response mask would (correctly) leave nothing to learn from; the other bundles have it off already
            "algorithm.filter_truncated_response=false",
            *tiny_args(tiny_model),
            "run.steps=2",
            "run.prompts_per_step=2",
            "algorithm.group_size=4",
            "eval.size=2",
            "checkpoint.interval=0",
            "model.max_new_tokens=8",
            "logger=wandb",
            "logger.mode=offline",
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (sweep / "sweep_summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["overrides"]) for r in rows] == [(str(i), f"algorithm={b}") for i, b in enumerate(BUNDLES)]
    for job, (bundle, r) in enumerate(zip(BUNDLES, rows)):
        assert f"algorithm {bundle};" in proc.stdout
        steps = [m for m in metric_rows(sweep / str(job), timings=True) if "train/loss" in m]
        assert [m["step"] for m in steps] == [1, 2], bundle
        for m in steps:
            assert m["train/skipped_nonfinite"] == 0.0, bundle
            assert m["train/samples_with_signal"] > 0, bundle
            assert 0.0 < m["policy/ratio_mean"] < 10.0, bundle
            assert m["train/grad_norm"] > 0, bundle
        assert steps[-1]["sync/version"] == 2.0, bundle
        assert r["status"] == "done" and r["steps"] == "2", r
        for key in ("rollout_tokens_per_s", "learner_tokens_per_s", "step_s", "sync_s"):
            assert float(r[key]) > 0, (key, r)
        for key in ("actor_idle_frac", "learner_idle_frac", "final_reward", "eval_accuracy"):
            assert 0 <= float(r[key]) <= 1, (key, r)
    assert (sweep / "sweep_summary.md").read_text().count("\n| ") == 1 + len(BUNDLES)
    assert (sweep / "sweep_summary.png").read_bytes().startswith(b"\x89PNG")
    # RunRecord.run_group is protobuf field 6, a string: tag byte 0x32, its length (a varint), its bytes. The
    # sweep path also appears in other fields (the run dir), so the tag is what proves it is the group.
    group = str(sweep).encode()
    assert len(group) < 128, "the length must fit a one-byte varint for this check"
    for job in range(len(BUNDLES)):
        assert b"\x32" + bytes([len(group)]) + group in wandb_history(sweep / str(job)), f"job {job}: not in {sweep}"


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
