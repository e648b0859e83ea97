"""The base a 4-bit learner trains, as its rollout actors serve it: the NF4 weights, dequantized.

Why: a 4-bit learner computes with dequant(NF4(W)), while an actor given `model.path` would serve W itself. On
the H200 the two policies differed by 0.64 nats per token before any training (docs/benchmarks.md), so most
importance ratios were clipped from the first step and the run barely learned. The actors must sample from the
model the learner trains, so they load this folder instead: `model.actor_path`, which the resolve step names
(rl/model_path.py dequantized_folder) and rl/app.py has made before the roles start.

How: the model is loaded exactly as the learner loads it (rl/learner/models.py `load_policy`: the same backend
and the same bitsandbytes NF4 settings, so the same codes), every 4-bit linear layer is dequantized with
bitsandbytes' `dequantize_4bit` (what the learner's forward does before its matmul), and those weights replace the
originals in a plain copy of the model, saved as an ordinary HF folder in the model's dtype. One folder per
(model files, backend, dtype, quantization, library versions) in the cache, written under a temporary name and renamed
(as rl/model_path.py converts the embedded model), so a run pays once and a killed one leaves nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path

from rl.config.schema import ModelConfig
from rl.model_path import write_model_folder


def dequantized_weights(model) -> dict[str, object]:
    """{module name in the plain model: its dequantized weight} for every bitsandbytes 4-bit linear layer of a
    (PEFT- or Unsloth-wrapped) model; the names drop the wrappers' prefixes and LoRA's `base_layer`."""
    import bitsandbytes as bnb

    out = {}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name, module in base.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            w = bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
            out[name.replace(".base_layer", "")] = w.cpu()
    return out


def dequantized_base(m: ModelConfig, *, max_seq_length: int, seed: int) -> str:
    """`model.actor_path` (the resolve step named it: rl/model_path.py dequantized_folder) holding the 4-bit
    learner's base of the resolved `model` group `m`, dequantized; made on this process's GPU the first time."""
    out = Path(m.actor_path)
    if (out / "config.json").is_file():
        return str(out)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.learner.models import load_policy

    # the learner's own loader: LoRA on top changes no base weight, and no reference copy is needed here
    policy = load_policy(m, torch.device("cuda"), max_seq_length=max_seq_length, seed=seed, kl=False)
    weights = dequantized_weights(policy.model)
    del policy
    torch.cuda.empty_cache()
    if not weights:
        raise RuntimeError(f"model.load_in_4bit=true, but the learner's model of {m.path} has no 4-bit layer")
    dtype = getattr(torch, m.dtype.value)  # resolved: never auto
    plain = AutoModelForCausalLM.from_pretrained(m.path, dtype=dtype, trust_remote_code=m.trust_remote_code)
    for name, w in weights.items():
        target = plain.get_submodule(name).weight
        if target.shape != w.shape:
            raise RuntimeError(f"dequantized {name}: shape {tuple(w.shape)} != the model's {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(w.to(target.dtype))

    def write(folder: Path) -> None:
        plain.save_pretrained(folder)
        AutoTokenizer.from_pretrained(m.path, trust_remote_code=m.trust_remote_code).save_pretrained(folder)
        info = {"model": m.path, "layers": len(weights)}
        (folder / "dequantized_from.json").write_text(json.dumps(info, indent=2))

    write_model_folder(out, write)
    print(f"the 4-bit learner's base, dequantized for the rollout actors: {out} ({len(weights)} layers)", flush=True)
    return str(out)
