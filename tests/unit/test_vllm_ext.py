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


def test_fused_merge_equals_base_plus_scaled_product():
    config = {"r": 4, "lora_alpha": 8}
    factors, scale = lora_factors(config, peft_weights())
    deltas = lora_deltas(config, peft_weights())
    w0 = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    for module, (b, a) in factors.items():
        fused = merge_lora(w0, b, a, scale)
        torch.testing.assert_close(fused, w0 + deltas[module], rtol=1e-6, atol=1e-5)


def test_bf16_merge_is_within_one_unit_in_the_last_place_of_the_exact_result():
    """The actor merges in the weights' dtype (factors rounded to bf16, fp32 accumulation): against the exact fp32
    merge, every element is within one bf16 ulp, with training-sized factors (|delta| << |W0|)."""
    weights = {k: v * (0.02 if "lora_A" in k else 1e-2) for k, v in peft_weights(rank=16).items()}
    config = {"r": 16, "lora_alpha": 32}
    factors, scale = lora_factors(config, weights)
    deltas = lora_deltas(config, weights)
    w0 = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for module, (b, a) in factors.items():
        merged = merge_lora(w0, b, a, scale)
        assert merged.dtype == torch.bfloat16
        exact = w0.float() + deltas[module]
        ulp = torch.finfo(torch.bfloat16).eps * exact.abs()  # spacing of bf16 numbers near each value (upper bound)
        assert bool(((merged.float() - exact).abs() <= ulp).all())
