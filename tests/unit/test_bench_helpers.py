"""The benchmark scripts' pure helpers: the random-model shape builder and the scaling projection."""

from __future__ import annotations

import pytest


def test_shapes_match_published_parameter_counts():
    from bench.shapes import parameter_count

    # Qwen2.5's published parameter counts, with their real vocabularies (config.json vocab_size)
    assert parameter_count("qwen2.5-0.5b", vocab_size=151936) == 494_032_768
    assert parameter_count("qwen2.5-7b", vocab_size=152064) == 7_615_616_512
    # the benchmark default (32k vocabulary) only shrinks the embedding (tied in 0.5B)
    assert parameter_count("qwen2.5-0.5b") == 494_032_768 - (151936 - 32000) * 896


def test_unknown_shape_names_the_valid_ones():
    from bench.shapes import shape_config

    with pytest.raises(ValueError, match="qwen2.5-0.5b"):
        shape_config("llama-9b")


def test_build_model_folder_loads_and_tokenizes(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.shapes import build_model_folder

    path = build_model_folder("tiny", tmp_path / "m", vocab_size=1000)
    assert not (tmp_path / "m.tmp").exists()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == 1000 and len(tok) <= 1000
    text = "What is 12 + 7?"
    assert tok.decode(tok(text)["input_ids"]) == text
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert model.generation_config.eos_token_id == tok.eos_token_id == 2
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 1000)
