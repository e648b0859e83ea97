"""Rollout engines behind one interface (generate, load_adapter, close): vLLM (vllm.py, with its worker extension
vllm_ext.py) and transformers `generate` (hf.py, for debugging). `rollout_class` picks one for a RolloutSpec."""

from __future__ import annotations

from rl.config.resolve import RolloutSpec


def rollout_class(spec: RolloutSpec) -> type:
    """The engine class a spec asks for (imports no engine library: each engine imports its own lazily)."""
    if spec.backend.value == "hf":
        from rl.rollout.hf import HFRollout

        return HFRollout
    from rl.rollout.vllm import VLLMRollout

    return VLLMRollout
