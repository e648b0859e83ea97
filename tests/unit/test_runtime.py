"""Runtime logic with fake roles: learner shards keep prompt groups whole, learner metrics merge, adapter
versions are checked on every generate, and the batch rule for several learners names its keys."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rl.config.schema import ConfigError, TrainConfig
from rl.runtime.groups import LocalGroup, merge_learner_metrics, shard_groups
from rl.runtime.runtime import Runtime
from rl.runtime.sync import VersionMismatch
from rl.types import Sampling, TrainSample
from tests.fakes import FakeActor, FakeLearner


def groups_of(sizes: list[int]) -> list[TrainSample]:
    return [TrainSample([g], [1, 2], [-1.0, -1.0], 1.0) for g, n in enumerate(sizes) for _ in range(n)]


def prompts(part: list[TrainSample]) -> list[int]:
    return [s.prompt_ids[0] for s in part]


@pytest.mark.parametrize(
    ("sizes", "n", "expected"),
    [
        ([4, 4], 2, [[0] * 4, [1] * 4]),
        ([4, 4, 4, 4], 2, [[0] * 4 + [1] * 4, [2] * 4 + [3] * 4]),
        ([4, 4, 4], 3, [[0] * 4, [1] * 4, [2] * 4]),
        ([4, 4, 4], 2, [[0] * 4, [1] * 4 + [2] * 4]),  # whole groups, as close to even as they allow
        ([3, 1, 4], 2, [[0] * 3 + [1], [2] * 4]),  # top-k / filters can leave groups of unequal size
    ],
)
def test_shards_cut_between_prompt_groups(sizes, n, expected):
    parts = shard_groups(groups_of(sizes), n)
    assert [prompts(p) for p in parts] == expected


def test_fewer_groups_than_learners_splits_a_group_so_no_learner_idles():
    samples = groups_of([4])
    parts = shard_groups(samples, 2)
    assert [len(p) for p in parts] == [2, 2]
    assert [s for p in parts for s in p] == samples  # order and content kept


def test_learner_metrics_merge():
    merged = merge_learner_metrics(
        [
            {"train/loss": 0.5, "time/learn_s": 2.0, "perf/learner_tokens_per_s": 10.0},
            {"train/loss": 0.5, "time/learn_s": 3.0, "perf/learner_tokens_per_s": 30.0},
        ]
    )
    assert merged == {"train/loss": 0.5, "time/learn_s": 3.0, "perf/learner_tokens_per_s": 40.0}


def test_train_step_shards_over_learners_and_reports_checksum_spread():
    learners = [FakeLearner(checksum=1.0, learn_s_per_sample=1.0), FakeLearner(checksum=1.25, learn_s_per_sample=1.0)]
    runtime = Runtime(LocalGroup([FakeActor()]), LocalGroup(learners))
    metrics = runtime.train_step(groups_of([4, 4]))
    assert [prompts(learner.seen[0]) for learner in learners] == [[0] * 4, [1] * 4]
    assert metrics["learner/checksum_spread"] == 0.25  # non-zero: the learners disagree
    assert metrics["time/learn_s"] == 4.0 and metrics["perf/learner_tokens_per_s"] == 2.0


def test_single_learner_gets_the_whole_batch():
    learner = FakeLearner()
    runtime = Runtime(LocalGroup([FakeActor()]), LocalGroup([learner]))
    samples = groups_of([4, 4])
    runtime.train_step(samples)
    assert learner.seen == [samples]


@pytest.mark.parametrize("method", ["generate", "probe"])
def test_an_actor_on_an_old_version_is_named(method):
    runtime = Runtime(LocalGroup([FakeActor(version=3), FakeActor(version=2)]), LocalGroup([FakeLearner()]))
    runtime.version = 3
    with pytest.raises(VersionMismatch, match=r"rollout actor 1 generated with adapter version 2, expected 3"):
        call = {"generate": runtime.generate, "probe": lambda p, s: runtime.probe_finish(runtime.probe_submit(p, s))}
        call[method]([[5, 6], [7, 8]], Sampling(n=1))


def typed(**overrides) -> TrainConfig:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), overrides))


def test_batch_must_split_evenly_over_learners():
    with pytest.raises(ConfigError, match=r"prompts_per_step \* algorithm.group_size = 8 \* 8 = 64 .*num_learners=3"):
        typed(run={"prompts_per_step": 8}, algorithm={"group_size": 8}, cluster={"num_learners": 3})
    assert (
        typed(
            run={"prompts_per_step": 12}, algorithm={"group_size": 8}, cluster={"num_learners": 3}
        ).cluster.num_learners
        == 3
    )
    assert typed(run={"prompts_per_step": 8}, cluster={"num_learners": 2}).cluster.num_learners == 2


def test_local_mode_stays_one_learner():
    with pytest.raises(ConfigError, match="cluster.mode=local runs one actor and one learner"):
        typed(cluster={"mode": "local", "num_learners": 2})
