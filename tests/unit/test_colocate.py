"""`cluster.colocate`: the config rules, the placement (actor i and learner i in one bundle, half its GPU each)
and the order of calls (the actors sleep before every learner step and wake before the sync loads into them).
The sleep itself is vLLM's CUDA-only sleep mode: tests/gpu/test_gpu.py runs it on a GPU."""

from __future__ import annotations

import pytest

from rl.config.cluster import ClusterConfig
from rl.config.schema import ConfigError
from rl.resolve import resolve
from rl.runtime.groups import LocalGroup
from rl.runtime.placement import role_plans
from rl.runtime.runtime import Runtime
from rl.types import Adapter, TrainSample
from tests.helpers import typed_config

GPU = {"cluster.use_gpu": True, "cluster.gpus_per_actor": 1, "cluster.gpus_per_learner": 1}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cluster.colocate": True}, "set cluster.use_gpu=true"),
        ({**GPU, "cluster.colocate": True, "cluster.staleness": 1}, "set cluster.staleness=0"),
        ({**GPU, "cluster.colocate": True, "cluster.num_learners": 2}, "cluster.num_actors equal to"),
        ({**GPU, "cluster.colocate": True, "cluster.gpus_per_actor": 2}, "gpus_per_learner <= 1"),
        ({**GPU, "cluster.colocate": True, "cluster.learner_chunk_size": 2}, "learner_chunk_size=0"),
    ],
)
def test_colocate_rules_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        typed_config(**overrides)


def test_colocate_reaches_every_role_through_one_key(tmp_path):
    """The engine's sleep mode, the learner's memory release, the bundles and the runtime's sleep/wake all read
    cluster.colocate from the one resolved config: nothing copies it."""
    cfg = resolve(typed_config(**GPU, **{"cluster.colocate": True}), tmp_path, model_path=str(tmp_path))
    assert cfg.cluster.colocate and Runtime(LocalGroup([]), LocalGroup([]), cfg.cluster).colocate
    plain = resolve(typed_config(**GPU), tmp_path, model_path=str(tmp_path))
    assert not (plain.cluster.colocate or Runtime(LocalGroup([]), LocalGroup([]), plain.cluster).colocate)


def test_colocated_pairs_share_a_bundle_and_split_its_gpu():
    c = ClusterConfig(num_actors=2, num_learners=2, use_gpu=True, cpus_per_learner=2, colocate=True)
    plans, bundles = role_plans(c)
    assert bundles == [{"CPU": 3.0, "GPU": 1.0}, {"CPU": 3.0, "GPU": 1.0}]
    assert [(r.role, r.index, r.bundle, r.resources["GPU"]) for r in plans] == [
        ("actor", 0, 0, 0.5),
        ("actor", 1, 1, 0.5),
        ("learner", 0, 0, 0.5),
        ("learner", 1, 1, 0.5),
    ]
    plans, bundles = role_plans(ClusterConfig(num_actors=2, num_learners=1, use_gpu=True))
    assert [r.bundle for r in plans] == [0, 1, 2] and all(b["GPU"] == 1.0 for b in bundles)


class Recorder:
    """A role that writes what it is asked to do, in order, to a shared log."""

    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def sleep(self):
        self.log.append(f"{self.name}.sleep")
        return {"seconds": 0.0}

    def wake_up(self):
        self.log.append(f"{self.name}.wake_up")
        return {"seconds": 0.0}

    def load_adapter(self, adapter):
        self.log.append(f"{self.name}.load_adapter")
        return {"seconds": 0.0, "bytes": adapter.nbytes}

    def train_step(self, samples):
        self.log.append(f"{self.name}.train_step")
        return {"train/loss": 0.0, "time/learn_s": 0.0}

    def get_adapter(self, for_sync):
        return Adapter(1, {}, b"w")


@pytest.mark.parametrize("colocate", [True, False])
def test_actors_sleep_for_the_learner_step_and_wake_for_the_sync(colocate, tmp_path):
    log: list[str] = []
    cfg = resolve(typed_config(**GPU, **{"cluster.colocate": colocate}), tmp_path, model_path=str(tmp_path))
    runtime = Runtime(LocalGroup([Recorder("actor", log)]), LocalGroup([Recorder("learner", log)]), cfg.cluster)
    metrics = runtime.train_step([TrainSample([1], [2], [-1.0], 1.0)]) | runtime.sync()
    if colocate:
        assert log == ["actor.sleep", "learner.train_step", "actor.wake_up", "actor.load_adapter"]
        assert {"time/actor_sleep_s", "time/actor_wake_s"} <= set(metrics)
    else:
        assert log == ["learner.train_step", "actor.load_adapter"]
        assert not {"time/actor_sleep_s", "time/actor_wake_s"} & set(metrics)
