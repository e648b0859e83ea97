"""Model folders written by the project (the embedded model converted, a 4-bit learner's base dequantized) appear
whole or not at all, and the dequantized base's cache folder changes with what its weights depend on."""

from __future__ import annotations

import pytest

from rl.model_path import write_model_folder


def test_a_model_folder_appears_whole_and_a_failed_writer_leaves_nothing(tmp_path):
    out = tmp_path / "models" / "m"

    def write(folder):
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"w")

    assert write_model_folder(out, write) == out
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]

    def broken(folder):
        (folder / "config.json").write_text("{}")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_model_folder(tmp_path / "models" / "other", broken)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["m"]  # no half folder, no temporary left


def test_the_dequantized_base_folder_follows_the_weights_it_is_made_from(tmp_path):
    from rl.model_path import dequantized_folder
    from rl.resolve import from_overrides

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"x" * 10)
    gpu4 = ("cluster.use_gpu=true", "model.load_in_4bit=true", "model.learner_backend=peft")
    first = dequantized_folder(from_overrides(str(model), *gpu4).model)
    assert first == dequantized_folder(from_overrides(str(model), *gpu4).model)  # the same inputs, the same cache entry
    assert first != dequantized_folder(from_overrides(str(model), *gpu4, "model.dtype=float16").model)
    (model / "model.safetensors").write_bytes(b"x" * 11)  # other weights under the same name
    assert first != dequantized_folder(from_overrides(str(model), *gpu4).model)
