"""Rollout engines behind one interface (rl/runtime/roles.py's `RolloutActor`): vLLM (vllm.py, with its worker
extension vllm_ext.py) and transformers `generate` (hf.py, for debugging). `rollout_class` picks the one that
`cluster.rollout_backend` names; each engine takes the config groups and values it uses (rl/app.py `rollout_args`
wires them, and holds the engine built to the protocol)."""

from __future__ import annotations

from rl.config.choices import RolloutBackend


def rollout_class(backend: RolloutBackend) -> type:
    """The engine class `cluster.rollout_backend` names (imports no engine library: each imports its own lazily)."""
    if backend == RolloutBackend.hf:
        from rl.rollout.hf import HFRollout

        return HFRollout
    from rl.rollout.vllm import VLLMRollout

    return VLLMRollout
