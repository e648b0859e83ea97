"""The merged-LoRA arithmetic of the vLLM worker extension (the engine part is tested end to end with vLLM)."""

from __future__ import annotations

import pytest
import torch

from rl.vllm_ext import lora_deltas, lora_factors, merge_lora


def peft_weights(rank: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        f"base_model.model.model.layers.0.self_attn.{p}.lora_{ab}.weight": torch.randn(*shape, generator=g)
        for p in ("q_proj", "v_proj")
        for ab, shape in (("A", (rank, 16)), ("B", (8, rank)))
    }


def test_factors_parse_peft_names_and_scaling():
    factors, scale = lora_factors({"r": 4, "lora_alpha": 8}, peft_weights())
    assert set(factors) == {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"}
    assert scale == 2.0
    assert lora_factors({"r": 4, "lora_alpha": 8, "use_rslora": True}, peft_weights())[1] == 4.0
    with pytest.raises(ValueError, match="lora_A only"):
        lora_factors({"r": 4, "lora_alpha": 8}, {k: v for k, v in peft_weights().items() if "lora_B" not in k})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_merge_equals_base_plus_scaled_product(dtype):
    config = {"r": 4, "lora_alpha": 8}
    factors, scale = lora_factors(config, peft_weights())
    deltas = lora_deltas(config, peft_weights())
    w0 = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    for module, (b, a) in factors.items():
        fused = merge_lora(w0, b, a, scale)
        assert fused.dtype == dtype
        expected = (w0.float() + deltas[module]).to(dtype)
        torch.testing.assert_close(
            fused, expected, rtol=1e-6 if dtype == torch.float32 else 0, atol=1e-5 if dtype == torch.float32 else 0.02
        )
