"""Rollout engines behind one interface (rl/runtime/roles.py's `RolloutActor`): vLLM (vllm.py, with its worker
extension vllm_ext.py) and transformers `generate` (hf.py, for debugging). `rollout_class` picks the one that
`cluster.rollout_backend` names; each engine takes the resolved `TrainConfig`."""

from __future__ import annotations

from typing import Protocol

from rl.config.choices import RolloutBackend
from rl.config.schema import TrainConfig
from rl.runtime.roles import RolloutActor


class RolloutEngine(RolloutActor, Protocol):
    """An engine class as rl/app.py and Ray start it: the role, built from the resolved config."""

    def __init__(self, cfg: TrainConfig) -> None: ...


def rollout_class(cfg: TrainConfig) -> type[RolloutEngine]:
    """The engine class `cluster.rollout_backend` names (imports no engine library: each imports its own lazily)."""
    if cfg.cluster.rollout_backend == RolloutBackend.hf:
        from rl.rollout.hf import HFRollout

        return HFRollout
    from rl.rollout.vllm import VLLMRollout

    return VLLMRollout
