"""The merged-LoRA arithmetic of the vLLM worker extension (the engine part is tested end to end with vLLM)."""

from __future__ import annotations

import pytest
import torch

from bench.common import lora_deltas
from rl.rollout.vllm_ext import InPlaceMerge, lora_factors, merge_lora, merged_payload


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


def test_a_bf16_base_served_in_fp32_is_merged_in_fp32():
    """With the engine's dtype the payload merges in it: a bf16 checkpoint's base served by an fp32 engine gets
    the fp32 sum to fp32 rounding; merged in the file's bf16, a training-sized delta (|delta| << |W0|) loses most of
    its bits to W0's bf16 spacing."""
    prefix = "model.layers.0.self_attn."
    base = {k: v.to(torch.bfloat16) for k, v in base_weights().items() if k.startswith(prefix)}
    weights = {k: v * (0.02 if "lora_A" in k else 1e-3) for k, v in peft_weights(rank=16).items()}
    factors, scale = lora_factors({"r": 16, "lora_alpha": 32}, weights)
    fp32 = dict(merged_payload(base, factors, scale, dtype=torch.float32))
    bf16 = dict(merged_payload(base, factors, scale))
    b, a = factors[prefix + "q_proj"]
    delta = scale * b @ a
    exact = base[prefix + "q_proj.weight"].float() + delta
    assert fp32[prefix + "q_proj.weight"].dtype == torch.float32 == fp32[prefix + "k_proj.weight"].dtype
    torch.testing.assert_close(fp32[prefix + "q_proj.weight"], exact, rtol=0, atol=1e-6)
    lost = (bf16[prefix + "q_proj.weight"].float() - exact).abs().mean() / delta.abs().mean()
    assert lost > 0.5  # the bf16 merge misses most of the delta (0.94 here)


def base_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return {
        f"model.layers.{i}.self_attn.{p}.weight": torch.randn(8, 16, generator=g)
        for i in (0, 1, 10)
        for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    }


def test_merged_payload_completes_fused_layers_and_streams_layer_by_layer():
    """q and v are targeted: k (their qkv_proj sibling) is sent at its base value so the fused layer is complete; the
    payload is lazy and each decoder layer's tensors come together (vLLM's layerwise reload then holds one layer)."""
    base = base_weights()
    factors, scale = lora_factors({"r": 4, "lora_alpha": 8}, peft_weights())
    payload = merged_payload(base, factors, scale)
    assert not isinstance(payload, list)
    got = dict(payload)
    prefix = "model.layers.0.self_attn."
    assert set(got) == {prefix + p + ".weight" for p in ("q_proj", "k_proj", "v_proj")}
    assert got[prefix + "k_proj.weight"] is base[prefix + "k_proj.weight"]
    b, a = factors[prefix + "q_proj"]
    torch.testing.assert_close(got[prefix + "q_proj.weight"], base[prefix + "q_proj.weight"] + scale * b @ a)
    # the same merge with an explicit device (the GPU path) gives the same tensors
    on_device = dict(merged_payload(base, factors, scale, device=torch.device("cpu")))
    for name, t in got.items():
        torch.testing.assert_close(on_device[name], t)
    # back to the base: every base projection, grouped by layer
    names = [n for n, _ in merged_payload(base, {}, 1.0)]
    assert len(names) == len(base)
    layers = [n.split(".")[2] for n in names]
    assert layers == sorted(layers) and len(set(layers)) == 3
    changes = sum(1 for x, y in zip(layers, layers[1:]) if x != y)
    assert changes == 2  # each layer's tensors are contiguous


def test_merged_payload_rejects_a_target_the_base_lacks_before_yielding_anything():
    factors, scale = lora_factors({"r": 4, "lora_alpha": 8}, peft_weights())
    base = {k: v for k, v in base_weights().items() if "layers.0.self_attn.v_proj" not in k}
    with pytest.raises(KeyError, match="layers.0.self_attn.v_proj"):
        merged_payload(base, factors, scale)  # raised at the call, not at the first next()


def fused_engine(base: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
    """The base as a vLLM engine holds it (q, k, v rows of one qkv_proj per layer, o_proj alone) and the slices
    `kernel_slices` would give for it."""
    slices, params = {}, {}
    for layer in (0, 1, 10):
        prefix = f"model.layers.{layer}.self_attn."
        qkv = torch.cat([base[prefix + p + ".weight"] for p in ("q_proj", "k_proj", "v_proj")])
        params[prefix + "qkv_proj"], params[prefix + "o_proj"] = qkv, base[prefix + "o_proj.weight"].clone()
        for i, p in enumerate(("q_proj", "k_proj", "v_proj")):
            slices[prefix + p + ".weight"] = (qkv, 8 * i, 8)
        slices[prefix + "o_proj.weight"] = (params[prefix + "o_proj"], 0, 8)
    return slices, params


def test_in_place_merge_writes_what_the_layerwise_payload_would_load():
    """The GPU path writes W0 + s * B @ A into the fused parameters' rows: the same values, bit for bit, as the
    payload the layerwise reload loads; the next adapter starts again from W0 (no delta accumulates), and an
    adapter that touches nothing any more puts the base back."""
    base = base_weights()
    slices, params = fused_engine(base)
    merge = InPlaceMerge(slices)
    factors, scale = lora_factors({"r": 4, "lora_alpha": 8}, peft_weights())
    for _ in range(2):  # twice: the second write must not add to the first
        assert merge.write(factors, scale) == 1  # q and v live in layer 0's qkv_proj
        expected = dict(merged_payload(base, factors, scale))
        prefix = "model.layers.0.self_attn."
        want = torch.cat([expected[prefix + p + ".weight"] for p in ("q_proj", "k_proj", "v_proj")])
        assert torch.equal(params[prefix + "qkv_proj"], want)
        assert torch.equal(
            params["model.layers.1.self_attn.qkv_proj"][8:16], base["model.layers.1.self_attn.k_proj.weight"]
        )
    assert merge.write({}, 1.0) == 1  # back to the base: the parameter the last adapter changed
    assert torch.equal(params["model.layers.0.self_attn.qkv_proj"][:8], base["model.layers.0.self_attn.q_proj.weight"])
    with pytest.raises(KeyError, match="mlp.up_proj"):
        merge.write({"model.layers.0.mlp.up_proj": factors["model.layers.0.self_attn.q_proj"]}, scale)


def fake_worker(model: str):
    from types import SimpleNamespace

    from rl.rollout.vllm_ext import LoraMergeExtension

    worker = LoraMergeExtension()
    worker.vllm_config = SimpleNamespace(model_config=SimpleNamespace(model=model, revision=None))
    return worker


def test_base_files_of_a_hub_id_come_from_the_local_hf_cache(tmp_path, monkeypatch):
    """lora_mode=merged with model.path=org/name: the base is the snapshot vLLM loaded from the HF cache."""
    cache = tmp_path / "hub"
    snap = cache / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "model.safetensors").write_bytes(b"")
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert fake_worker("org/tiny")._rlft_base_files() == [snap / "model.safetensors"]


def test_base_without_safetensors_fails_with_the_fix(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(RuntimeError, match="needs the base weights as \\*.safetensors.*lora_mode=native"):
        fake_worker(str(tmp_path))._rlft_base_files()
