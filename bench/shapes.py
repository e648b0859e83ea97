"""Random-initialised model folders of a named shape, built offline (no hub), for benchmarks on machines without
the real weights (the GPU machine has no hub access).

python -m bench.shapes qwen2.5-0.5b /tmp/qwen05-random [--vocab-size 32000] [--layers N] [--device cuda]

The shapes copy the published configs (Qwen2.5 config.json: hidden size, layers, heads, KV heads, MLP width,
tied embeddings, rope theta) except the vocabulary, which is `vocab_size` (32k by default instead of 151,936) so
that the folder also carries a matching tokenizer built here (byte-level BPE trained offline, ChatML template).
Speed depends on the shapes, not on the weights or the words, so these folders give the real models' tokens/s up
to the smaller vocabulary's embedding and LM head (a random model also never stops early: every completion runs
to max_tokens unless it samples <|im_end|>).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# Published Qwen2.5 configs (huggingface.co/Qwen/Qwen2.5-*/config.json), vocabulary left out; "tiny" is a
# 2-layer shape for tests and quick CPU runs (head_dim 64, as vLLM's CPU attention wants).
SHAPES: dict[str, dict] = {
    "tiny": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        rope_theta=1000000.0,
    ),
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def shape_config(name: str, *, vocab_size: int = 32000, layers: int | None = None, max_len: int = 4096):
    """A transformers Qwen2Config for the named shape (optionally with fewer layers)."""
    from transformers import Qwen2Config

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; valid: {', '.join(SHAPES)}")
    kw = dict(SHAPES[name])
    if layers is not None:
        kw["num_hidden_layers"] = layers
    return Qwen2Config(
        vocab_size=vocab_size,
        max_position_embeddings=max_len,
        max_window_layers=kw["num_hidden_layers"],
        use_sliding_window=False,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=2,  # <|im_end|>: the chat turn's end, as in Qwen2.5-Instruct
        pad_token_id=0,
        **kw,
    )


def parameter_count(name: str, *, vocab_size: int = 32000, layers: int | None = None) -> int:
    """Parameters of the shape, counted on the meta device (nothing allocated)."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(shape_config(name, vocab_size=vocab_size, layers=layers))
    return sum(p.numel() for p in model.parameters())


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer (the GPT-2/Qwen kind) with `vocab_size` tokens, trained here in about 2 s on the
    Python standard library's own source files (present on every machine, so no download). Ids 0-2 are Qwen's
    special tokens; the chat template is ChatML, as in Qwen2.5-Instruct."""
    import glob
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model_folder(
    name: str,
    out: str | Path,
    *,
    vocab_size: int = 32000,
    layers: int | None = None,
    dtype: str = "bfloat16",
    device: str = "cpu",
    seed: int = 0,
) -> Path:
    """Write a random-initialised model of the named shape (bf16 safetensors + tokenizer) to `out`, written under
    a temporary name and renamed; an existing complete folder is reused."""
    import shutil

    import torch
    from transformers import Qwen2ForCausalLM

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(seed)
    cfg = shape_config(name, vocab_size=vocab_size, layers=layers)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.save_pretrained(tmp)
    build_tokenizer(vocab_size).save_pretrained(tmp)
    (tmp / "rlft_shape.json").write_text(json.dumps({"shape": name, "vocab_size": vocab_size, "layers": layers}))
    tmp.rename(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=list(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    path = build_model_folder(
        args.shape, args.out, vocab_size=args.vocab_size, layers=args.layers, dtype=args.dtype, device=args.device
    )
    n = parameter_count(args.shape, vocab_size=args.vocab_size, layers=args.layers)
    print(json.dumps({"shape": args.shape, "path": str(path), "parameters": n}))


if __name__ == "__main__":
    main()
