"""The CPU learner's attention: the model's own eager attention for short sequences that will be backpropagated,
torch SDPA otherwise.

On CPU, SDPA picks its flash kernel, whose backward is slow at short lengths: at the demo's shapes (57-token prompts,
completions of up to 40 tokens: about 90 keys) its backward took many times its forward, and a learner step with the
model file's eager attention (matmul, fp32 softmax, matmul) was faster. From about 150-250 keys the two are even,
and beyond flash is faster. A forward without gradient (the KL reference, generation) keeps SDPA, whose forward is
faster at every length. Measurements and commands: docs/benchmarks.md, "CPU learner attention".

Registered with transformers' `AttentionInterface` as ATTENTION; the mask is SDPA's (boolean, or None where SDPA
would use its causal flag), made additive for the eager path. GPU learners never use it. `switch_attention` is how
both of the learner's own attention functions (this one and packing.py's) are registered and switched on.
"""

from __future__ import annotations

import sys

import torch

ATTENTION = "rl_cpu_short_eager"
EAGER_MAX_KEYS = 128  # at most this many keys (prompt + completion): eager; above: SDPA


def short_eager_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers attention function: [B, H, Q, D] query, [B, Hkv, K, D] key and value -> ([B, Q, H, D], weights)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None or not torch.is_grad_enabled() or key.shape[-2] > EAGER_MAX_KEYS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    q, k = query.shape[-2], key.shape[-2]
    if attention_mask is None and q > 1:  # SDPA's mask skipped as plain causal: the queries are the last q keys
        attention_mask = torch.ones(q, k, dtype=torch.bool, device=query.device).tril(k - q)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min
        )
    return eager(module, query, key, value, attention_mask, **kwargs)


def use_short_eager_attention(model) -> None:
    """Switch `model` to ATTENTION, where transformers has an attention registry (else it keeps its default)."""
    try:
        from transformers.masking_utils import sdpa_mask

        switch_attention(model, ATTENTION, short_eager_attention, sdpa_mask)
    except ImportError:
        return


def switch_attention(model, name: str, attention_fn, mask_fn) -> None:
    """Register `attention_fn` and its `mask_fn` with transformers as `name` and switch `model` (a transformers model,
    PEFT-wrapped or not) to it. ImportError where transformers has no attention registry (< 4.53)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_fn)
    AttentionMaskInterface.register(name, mask_fn)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "set_attn_implementation"):
        base.set_attn_implementation(name)
    else:  # older transformers: the attention modules read the config at each forward
        base.config._attn_implementation = name
