"""A model's shapes, read from its config.json without loading it (a local folder, the converted embedded model, or
the Hugging Face cache for a hub id): parameter counts and bytes per precision, the KV bytes per token, the
modules LoRA can target. What the plan (plan.py) and the start-up diagnosis (diagnose.py) size memory from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rl.config.schema import ConfigError

NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)  # 4-bit code + 8-bit absmax per 64 + fp32 per 256 absmax blocks = 4.127
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a decoder-only transformer (Llama/Qwen/Mistral style) that size its memory."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = True
    qkv_bias: bool = False
    dtype: str = "bfloat16"  # the checkpoint's dtype (config.json torch_dtype / dtype)
    name: str = ""

    @classmethod
    def from_hf_config(cls, cfg: dict, name: str = "") -> ModelShape:
        cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg  # multimodal wrappers
        experts = [k for k in ("num_experts", "num_local_experts", "n_routed_experts") if cfg.get(k)]
        if experts:
            raise ValueError(
                f"{name or 'the model'} is a mixture of experts ({experts[0]}): not sized by this estimate"
            )
        try:
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            return cls(
                layers=int(cfg["num_hidden_layers"]),
                hidden=hidden,
                intermediate=int(cfg["intermediate_size"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                vocab=int(cfg["vocab_size"]),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases and has no attention_bias key; Llama's says
                qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
                dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
                name=name or str(cfg.get("_name_or_path") or cfg.get("model_type", "")),
            )
        except KeyError as e:
            raise ValueError(f"config.json of {name or 'the model'} has no {e.args[0]}: not a decoder-only LM") from e

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of a block, by the module names LoRA targets use."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def block_linear_weights(self) -> int:
        """Weights of the blocks' linear layers (what 4-bit quantises), biases excluded."""
        return self.layers * sum(a * b for a, b in self.module_shapes().values())

    @property
    def params(self) -> int:
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        norms = self.layers * 2 * self.hidden + self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.block_linear_weights + self.layers * bias + norms + embeddings

    def lora_params(self, rank: int, targets: list[str]) -> int:
        shapes = self.module_shapes()
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ConfigError(f"model.lora_targets: {unknown} are not modules of this model; valid: {list(shapes)}")
        return self.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)

    def flops_per_token(self, *, train: bool = False) -> int:
        """Matmul FLOPs per token, 2N forward and 6N forward + backward (Kaplan et al. 2020, sec. 2.1), for
        projecting throughput; attention's sequence-length term is left out. With LoRA the backward still
        propagates through every frozen weight, so 6N holds to within the adapter's share."""
        return (6 if train else 2) * self.params

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_dim * dtype_bytes

    def weight_bytes(self, dtype_bytes: float, load_in_4bit: bool = False) -> float:
        if load_in_4bit:
            return self.block_linear_weights * NF4_BITS / 8 + (self.params - self.block_linear_weights) * 2
        return self.params * dtype_bytes


def load_shape(path: str) -> tuple[ModelShape | None, str]:
    """Shapes for `model.path` without loading the model: (shape, where config.json came from) or (None, why
    not). A local path that is not a model folder is a ConfigError (the run would fail the same way)."""
    from rl import model_path as models

    if path.startswith("embedded:"):
        name = path.removeprefix("embedded:")
        if name not in models.EMBEDDED:
            models.embedded_gguf(name)  # raises the ConfigError listing the embedded models
        cfg_file = models.cache_dir() / "models" / models.EMBEDDED[name][2] / "config.json"
        if not cfg_file.is_file():  # not converted yet (the first run does it): the config its GGUF converts to
            gguf = models.embedded_gguf(name)
            config = models.gguf_config(gguf).to_dict()
            return ModelShape.from_hf_config(config, name=path), f"{gguf} (its metadata; the first run converts it)"
    elif path.startswith(("/", ".", "~")) or Path(path).expanduser().exists() or path.count("/") != 1:
        cfg_file = Path(models.resolve_model_path(path)) / "config.json"  # validates the folder
    else:
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None, "huggingface_hub is not installed"
        found = try_to_load_from_cache(path, "config.json")
        if not isinstance(found, str):
            return None, f"no config.json for {path} in the local HF cache (`hf download {path} config.json`)"
        cfg_file = Path(found)
    return ModelShape.from_hf_config(json.loads(cfg_file.read_text()), name=path), str(cfg_file)
