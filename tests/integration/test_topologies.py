"""Every conf/cluster topology trains on a real local Ray (here 2a2l; the others in the files named below);
data-parallel learners stay identical and match one learner on the whole batch; a rollout actor left on an old
adapter version stops the run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load

from rl.config.choices import ClusterMode, DType, RolloutBackend
from rl.config.cluster import ClusterConfig
from rl.config.schema import AlgorithmConfig, EvalConfig, LearnerConfig, ModelConfig, RunConfig, TrainConfig
from rl.runtime.roles import Learner
from tests.helpers import LENGTH_REWARD, REPO, make_samples, metric_rows, run_train, scratch_run_dir

pytestmark = pytest.mark.slow

TINY_RUN = [
    "run.steps=2",
    "algorithm.group_size=4",
    "eval.size=0",
    "model.max_new_tokens=12",
    "learner.micro_batch_size=8",
    *LENGTH_REWARD,
    "model.dtype=float32",
    "model.learner_dtype=float32",
    "run.sync_probe_threshold=0.01",
    "cluster.learner_threads=1",  # several roles share 2 cores here
]

# 2a2l with HF generate (an engine start costs 15-30 s on 2 cores; real vLLM engines train in the files named below).
TRAINED_HERE = "2a2l"
# 3a1l and 1a3l differ from 2a1l / 2a2l only in how many actors or learners there are: the paths they take (prompts
# split over actors, the adapter sent to each, gradients summed over learners) run here and in test_faults.py with
# two of each, and tests/unit/test_config.py plans their roles on a 2-core machine.
PLANNED_ONLY = {"3a1l", "1a3l"}


def test_every_cluster_file_trains_in_the_suite():
    elsewhere = {
        name
        for f in Path(__file__).parent.glob("test_*.py")
        if f.name != Path(__file__).name
        for name in re.findall(r'"cluster=(\w+)"', f.read_text())
    }
    trained = elsewhere | {TRAINED_HERE}
    assert not PLANNED_ONLY & trained
    assert sorted(trained | PLANNED_ONLY) == sorted(f.stem for f in (REPO / "conf" / "cluster").glob("*.yaml"))


def test_two_actors_and_two_data_parallel_learners_train_two_steps(tiny_model, tmp_path):
    out = tmp_path / "run"
    extra = ["cluster.rollout_backend=hf", "run.prompts_per_step=2"]  # one prompt group per learner
    proc = run_train(
        [f"model.path={tiny_model}", f"run.output_dir={out}", f"cluster={TRAINED_HERE}", *TINY_RUN, *extra]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metric_rows(out, timings=True)
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # every actor generated with the adapter published by the step before, and the probe agrees with learner 0
    assert [r["actor/adapter_version"] for r in steps] == [0.0, 1.0]
    assert all(r["sync/logprob_abs_diff"] < 0.01 for r in steps)
    assert all(r["learner/checksum_spread"] == 0.0 for r in steps), [r["learner/checksum_spread"] for r in steps]
    assert "2 rollout actor(s), 2 learner(s)" in proc.stdout
    weights = load((out / "adapter" / "adapter_model.safetensors").read_bytes())
    assert any(float(t.abs().max()) > 0 for k, t in weights.items() if "lora_B" in k)


# ------------------------------------------------------------------------------------------------ in-process


def tiny_run(model: Path, loss_agg: str = "seq_mean_token_mean", run_dir: Path | None = None, **cluster):
    """The resolved config of a tiny run in this process (roles built by rl.app.build_runtime)."""
    from rl.resolve import resolve

    return resolve(tiny_config(model, loss_agg, **cluster), run_dir or scratch_run_dir(), model_path=str(model))


def tiny_config(model: Path, loss_agg: str = "seq_mean_token_mean", **cluster) -> TrainConfig:
    return TrainConfig(
        algorithm=AlgorithmConfig(loss_agg=loss_agg),
        model=ModelConfig(
            path=str(model), dtype=DType.float32, learner_dtype=DType.float32, max_new_tokens=8, lora_rank=4
        ),
        cluster=ClusterConfig(
            rollout_backend=RolloutBackend.hf, cpus_per_actor=0.5, cpus_per_learner=0.5, learner_threads=1, **cluster
        ),
        run=RunConfig(prompts_per_step=2),
        learner=LearnerConfig(micro_batch_size=4),
        eval=EvalConfig(size=0),
    )


def lora_tensors(runtime) -> list[dict[str, torch.Tensor]]:
    return [load(a.weights) for a in runtime.learners.broadcast(Learner.get_adapter)]


@pytest.mark.parametrize("loss_agg", ["seq_mean_token_mean", "token_mean"])  # sequence / token normaliser
def test_data_parallel_learners_stay_identical_and_match_one_learner(tiny_model, loss_agg):
    from rl.app import build_runtime

    # 3 groups over 2 learners: unequal shards (8 and 4 samples), so a per-learner normaliser would show
    batches = [make_samples(groups=3, group_size=4, seed=s, old_logprob=-10.8) for s in (1, 2)]
    single, close_single = build_runtime(tiny_run(tiny_model, loss_agg, mode=ClusterMode.local))
    try:
        single_metrics = [single.train_step(b) for b in batches]
        (reference,) = lora_tensors(single)
    finally:
        close_single()
    dp, close_dp = build_runtime(tiny_run(tiny_model, loss_agg, num_actors=1, num_learners=2))
    try:
        dp_metrics = [dp.train_step(b) for b in batches]
        checksums = dp.learners.broadcast(Learner.adapter_checksum)
        learner0, learner1 = lora_tensors(dp)
    finally:
        close_dp()
    assert checksums[0] == checksums[1]
    assert [m["learner/checksum_spread"] for m in dp_metrics] == [0.0, 0.0]
    assert learner0.keys() == learner1.keys() == reference.keys()
    for k in reference:
        assert torch.equal(learner0[k], learner1[k]), k  # bit-identical: same summed gradient, same step
        assert torch.allclose(learner0[k], reference[k], atol=1e-6, rtol=0), (
            k,
            (learner0[k] - reference[k]).abs().max(),
        )
    assert any(float(t.abs().max()) > 0 for k, t in reference.items() if "lora_B" in k)
    # the global normaliser: loss and pre-clip gradient norm equal one learner's on the whole batch
    for s, d in zip(single_metrics, dp_metrics):
        assert d["train/loss"] == pytest.approx(s["train/loss"], rel=1e-5, abs=1e-7)
        assert d["train/grad_norm"] == pytest.approx(s["train/grad_norm"], rel=1e-5)
        assert d["train/samples_with_signal"] == s["train/samples_with_signal"]


class TinyEnv:
    def train_items(self) -> list[dict]:
        return [{"messages": [{"role": "user", "content": f"Say {i}."}], "answer": str(i)} for i in range(8)]

    def eval_items(self) -> list[dict]:
        return []


def test_actor_left_on_an_old_adapter_version_stops_the_run(tiny_model, tmp_path):
    """Inject the most common silent bug: one actor misses a sync and keeps generating with the old adapter."""
    import ray
    from transformers import AutoTokenizer

    from rl.app import build_runtime
    from rl.loop.driver import train
    from rl.metrics import MetricsLogger
    from rl.runtime.sync import VersionMismatch
    from tests.helpers import LengthReward

    cfg = tiny_run(tiny_model, num_actors=2, num_learners=1, run_dir=tmp_path)
    runtime, teardown = build_runtime(cfg)
    logger = MetricsLogger(tmp_path, kind="none", total_steps=2)
    try:
        old = runtime.adapter()  # version 0: what the actors hold before the first sync
        synced = runtime.sync

        def sync_missing_actor_1() -> dict[str, float]:
            metrics = synced()
            ray.get(runtime.actors.handles[1].load_adapter.remote(old))
            return metrics

        runtime.sync = sync_missing_actor_1
        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
        with pytest.raises(VersionMismatch, match=r"rollout actor 1 generated with adapter version 0, expected 1"):
            train(cfg, runtime, tokenizer, TinyEnv(), LengthReward(), logger, resolved={})
    finally:
        teardown()
        logger.close()
    assert not ray.is_initialized()


def test_roles_that_do_not_fit_fail_with_the_keys_to_change(tiny_model, tmp_path):
    proc = run_train(
        [
            f"model.path={tiny_model}",
            f"run.output_dir={tmp_path / 'run'}",
            "cluster=3a1l",
            "cluster.cpus_per_actor=1000",
        ],
        timeout=300,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]  # Ray itself may print a notice before it
    assert last.startswith("error: the roles need 3000.5 CPU and 0 GPU but Ray has "), proc.stderr[-3000:]
    assert "cluster.cpus_per_actor" in last and "cluster.ray_num_cpus" in last
