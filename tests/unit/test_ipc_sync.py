"""`cluster.weight_sync=ipc` with a LoRA adapter: the config rules, the packed layout the factors leave the learner
in (the same tensors as the bytes sync), and the runtime's order of calls. Opening the handle and merging from it
is CUDA-only: tests/gpu (jobs.ipc_vs_bytes and the colocated IPC run) does that on a GPU."""

from __future__ import annotations

import pytest
import torch

from rl.config.schema import ConfigError
from rl.flat import pack, unpack
from rl.learner.export import adapter_tensors
from rl.resolve import from_overrides, resolve
from rl.rollout.vllm_ext import lora_factors
from rl.runtime.groups import LocalGroup
from rl.runtime.runtime import Runtime
from rl.types import Adapter
from tests.helpers import make_learner, typed_config

GPU = {
    "cluster.use_gpu": True,
    "cluster.weight_sync": "ipc",
    "cluster.gpus_per_actor": 0.5,
    "cluster.gpus_per_learner": 0.5,
}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({**GPU, "cluster.lora_mode": "native"}, "set cluster.lora_mode=merged"),
        ({**GPU, "cluster.rollout_backend": "hf"}, "set cluster.rollout_backend=vllm"),
        ({"cluster.weight_sync": "ipc"}, "set cluster.use_gpu=true"),
        # the handles open only on learner 0's GPU: every actor must be there
        (
            {**GPU, "cluster.gpus_per_actor": 1.0},
            r"x cluster.gpus_per_actor=1.0 \+ cluster.gpus_per_learner=0.5 = 1.5 GPUs",
        ),
        (
            {**GPU, "cluster.num_actors": 2, "cluster.gpus_per_learner": 0.2},
            "= 1.2 GPUs: make them fit one GPU \\(e.g. cluster.gpus_per_actor=0.33 cluster.gpus_per_learner=0.33\\)",
        ),
        (
            {**GPU, "cluster.colocate": True, "cluster.num_actors": 2, "cluster.num_learners": 2},
            "set cluster.num_actors=1 cluster.num_learners=1",
        ),
    ],
)
def test_ipc_rules_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        typed_config(**overrides)


def test_ipc_placements_that_share_learner_0s_gpu_load():
    typed_config(**{**GPU, "cluster.num_actors": 2, "cluster.gpus_per_actor": 0.25})  # 2 x 0.25 + 0.5
    typed_config(**{**GPU, "cluster.colocate": True, "cluster.gpus_per_actor": 1.0, "cluster.gpus_per_learner": 1.0})
    typed_config(**{**GPU, "cluster.num_learners": 2})  # learner 1 may sit elsewhere: it sends no handles


def test_a_lora_run_may_sync_through_ipc(tmp_path):
    cfg = resolve(typed_config(**GPU), tmp_path, model_path=str(tmp_path))
    assert cfg.cluster.weight_sync == "ipc" and not cfg.model.full_finetune
    assert cfg.cluster.lora_mode == "merged"


def test_packed_factors_are_the_bytes_adapter(tiny_model):
    """What the engine opens from the handle (the packed buffer, unpacked) is exactly what it would load from the
    bytes: the same keys, values and dtype, hence the same factors and scale for the merge."""
    from safetensors.torch import load

    learner = make_learner(tiny_model, "model.dtype=bfloat16")
    flat, names, shapes = pack(adapter_tensors(learner.model, learner.sync_dtype))
    assert flat.dim() == 1 and flat.dtype == torch.bfloat16
    opened = unpack(flat.clone(), names, shapes)  # the engine's side: views of one buffer
    wire = load(learner.get_adapter(for_sync=True).weights)
    assert opened.keys() == wire.keys() and all(torch.equal(opened[k], wire[k]) for k in wire)
    config = learner.get_adapter().config
    (ours, s1), (theirs, s2) = lora_factors(config, opened), lora_factors(config, wire)
    assert s1 == s2 and ours.keys() == theirs.keys()
    assert all(torch.equal(ours[m][i], theirs[m][i]) for m in ours for i in (0, 1))


def test_pack_refuses_what_it_cannot_lay_out():
    with pytest.raises(ValueError, match="one dtype"):
        pack([("a", torch.zeros(2)), ("b", torch.zeros(2, dtype=torch.float64))])
    flat, names, shapes = pack([("a", torch.zeros(2, 3))])
    with pytest.raises(ValueError, match="covers 6 elements of a 7-element buffer"):
        unpack(torch.zeros(7), names, shapes)


def test_ipc_needs_a_cuda_learner(tiny_model):
    with pytest.raises(RuntimeError, match="needs the learner on a CUDA GPU"):
        make_learner(tiny_model).ipc_weights()


def ipc_runtime_config(*keys: str):
    """A resolved config that syncs through IPC, for a Runtime over fake roles (it reads the cluster group); no
    restarts budget: the tests fake the one restart they need."""
    gpu = [f"{k}={v}" for k, v in GPU.items()]
    return from_overrides("unused", *gpu, "cluster.actor_max_restarts=0", *keys)


class Recorder:
    def __init__(self, name: str, log: list[str], version: int = 3):
        self.name, self.log, self.version = name, log, version

    def wake_up(self):
        self.log.append(f"{self.name}.wake_up")
        return {"seconds": 0.0}

    def get_version(self):
        return self.version

    def get_adapter(self, for_sync):
        self.log.append(f"{self.name}.get_adapter")
        return Adapter(self.version, {}, b"w")

    def load_adapter(self, adapter):
        self.log.append(f"{self.name}.load_adapter v{adapter.version}")
        return {"seconds": 0.0, "bytes": adapter.nbytes}

    def ipc_weights(self):
        self.log.append(f"{self.name}.ipc_weights")
        return {"lora_config": {}, "names": [], "shapes": [], "ipc_handle": {}}

    def release_ipc_weights(self):
        self.log.append(f"{self.name}.release_ipc_weights")

    def load_weights_ipc(self, info, version):
        self.log.append(f"{self.name}.load_weights_ipc v{version} {sorted(info)}")
        return {"seconds": 0.01, "bytes": 0}


@pytest.mark.parametrize("colocate", [True, False])
def test_the_ipc_sync_hands_the_learners_handles_to_every_actor_then_releases_them(colocate):
    log: list[str] = []
    actors = LocalGroup([Recorder("actor0", log), Recorder("actor1", log)])
    cfg = ipc_runtime_config(f"cluster.colocate={colocate}")
    runtime = Runtime(actors, LocalGroup([Recorder("learner", log)]), cfg.cluster)
    metrics = runtime.sync()
    loads = [f"actor{i}.load_weights_ipc v3 ['ipc_handle', 'lora_config', 'names', 'shapes']" for i in (0, 1)]
    woke = ["actor0.wake_up", "actor1.wake_up"] if colocate else []
    assert log == [*woke, "learner.ipc_weights", *loads, "learner.release_ipc_weights"]
    assert runtime.version == 3 and metrics["sync/version"] == 3.0 and metrics["sync/actor_load_s"] == 0.01
    assert 0 <= metrics["time/sync_export_s"] <= metrics["time/sync_s"]


def test_a_restarted_actor_gets_the_published_policy_as_bytes():
    """The IPC sync puts nothing in the object store, so an actor that Ray restarted (base model, version 0) is sent
    learner 0's policy as bytes when it is back, if that is still the published version (fetched once per sync);
    while the learner is past it (staleness > 0) the actor waits for the next sync, which takes it back: never a
    version from the future."""
    log: list[str] = []
    learner = Recorder("learner", log)
    runtime = Runtime(
        LocalGroup([Recorder("actor0", log), Recorder("actor1", log)]),
        LocalGroup([learner]),
        ipc_runtime_config("cluster.staleness=1").cluster,
    )
    runtime.sync()
    log.clear()
    learner.version = 4  # the learner stepped past the published version 3
    runtime.pool.restarting.add(1)  # Ray restarted actor 1; it answers again
    runtime.pool.rejoin(wait=False)
    assert log == [] and runtime.live_actors() == [0]  # the learner is ahead: its adapter is not even fetched
    log.clear()
    runtime.sync()  # version 4: the live actor through IPC, then actor 1 as bytes
    assert log == [
        "learner.ipc_weights",
        "actor0.load_weights_ipc v4 ['ipc_handle', 'lora_config', 'names', 'shapes']",
        "learner.release_ipc_weights",
        "learner.get_adapter",
        "actor1.load_adapter v4",
    ]
    assert runtime.live_actors() == [0, 1]
    log.clear()
    runtime.pool.restarting.add(0)  # another restart within the same version: the bytes fetched above, again
    runtime.pool.rejoin(wait=False)
    assert log == ["actor0.load_adapter v4"] and runtime.live_actors() == [0, 1]
