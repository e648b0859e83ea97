"""Padding-free micro-batches: the samples of a micro-batch packed into one row, each attending only to itself.

With `learner.micro_batch_tokens > 0` the learner fills micro-batches up to a token budget instead of a sequence count and
runs each as one row of `sum(len)` tokens: no padding, so with completions of very different lengths (20 to 1000
tokens) no forward, backward or LM-head work is spent on pad positions. Position ids restart for every sequence,
and the attention sees the row as separate segments:

- plain: `[p1 c1 | p2 c2 | ...]`, each segment causal over itself.
- shared prompt (`learner.share_prompt_prefix`): `[p c1 c2 ... cG | ...]`: a group's prompt once, then its completions;
  a completion attends to its prompt and to its own earlier tokens, and its positions continue from the prompt's.
  The same values as G full forwards (the prompt's states are the same in each), computed once.

The attention is a function registered with transformers' `AttentionInterface` ("rl_packed") that the learner's
model is switched to: given the segments (a keyword argument of the forward) it runs either a varlen flash kernel
(CUDA: `flash_attn.flash_attn_varlen_func`, else torch's `varlen_attn`) on the row, or torch SDPA once per segment
(any device, CPU included); without them it is SDPA with transformers' own mask, so generation on the learner is
unchanged. A backend that replaces the attention forward (Unsloth) ignores the segments: `Batcher.check_packing`
(batching.py) compares a packed and a padded forward once at start, and the learner trains in padded micro-batches
(with a warning) when they differ.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from rl.learner.attention import switch_attention
from rl.learner.transfer import upload
from rl.types import TrainSample

ATTENTION = "rl_packed"


def pack_micro_batches(samples: list[TrainSample], budget: int, share_prompt_prefix: bool) -> list[list[TrainSample]]:
    """Consecutive samples, at most `budget` row tokens each (a longer sample gets a micro-batch alone). With a shared
    prompt a sample whose prompt equals the previous one's costs only its completion: the row holds the prompt once.
    Next fit in the given order: exact whatever the split (the loss weights micro-batches by their share), and the
    order keeps groups together."""
    out: list[list[TrainSample]] = []
    used = 0
    for s in samples:
        shared = share_prompt_prefix and out and out[-1][-1].prompt_ids == s.prompt_ids
        cost = len(s.completion_ids) + (0 if shared else len(s.prompt_ids))
        if out and used + cost <= budget:
            out[-1].append(s)
            used += cost
        else:
            out.append([s])
            used = len(s.prompt_ids) + len(s.completion_ids)
    return out


@dataclass
class Segments:
    """One packed row: query range i = [q_start[i], q_start[i+1]) attends, causally aligned at its end, to the keys
    `key_index[k_start[i]:k_start[i+1]]` (its prompt's positions, if shared, then its own)."""

    q_start: list[int]  # [S + 1]
    k_start: list[int]  # [S + 1]
    key_index: torch.Tensor  # [sum of key lengths] long, on the model's device
    backend: str  # "sdpa" (a loop over segments) or "varlen" (one flash kernel call)
    _cu: tuple | None = None

    def cu_seqlens(self, device) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        if self._cu is None:
            q, k = (upload(torch.tensor(x, dtype=torch.int32), device) for x in (self.q_start, self.k_start))
            self._cu = (q, k, _longest(self.q_start), _longest(self.k_start))
        return self._cu


def mask_placeholder(device) -> torch.Tensor:
    """The packed forward's `attention_mask`: a [1, 1, 1, 1] placeholder that `packed_attention` ignores (the
    segments are the mask). transformers passes a 4D mask through as it is; given none, it would look for packed
    sequences in the restarting position ids itself, reading a device value in every forward (a wait for the GPU
    between micro-batches)."""
    return torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)


def _longest(starts: list[int]) -> int:
    """The longest range of a cumulative start list (flash attention's max_seqlen), counted on the host."""
    return max(b - a for a, b in zip(starts, starts[1:]))


@dataclass
class PackedRow:
    """Model inputs of one packed micro-batch and where its completion tokens are."""

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    segments: Segments
    predictors: torch.Tensor  # [T] row positions whose logits predict the completion tokens, in sample order
    targets: torch.Tensor  # [1, T] the completion tokens, concatenated in sample order
    rows: torch.Tensor  # [T] sample index of each target (to unpack into [B, C])
    cols: torch.Tensor  # [T] its index within the completion


def pack(samples: list[TrainSample], share_prompt_prefix: bool, device, backend: str) -> PackedRow:
    """The row of `samples` (see the module docstring for the two layouts)."""
    ids: list[int] = []
    pos: list[int] = []
    q_start, k_start, key_index = [0], [0], list[int]()
    predictors: list[int] = []
    prompt_at = -1  # row offset of the current shared prompt
    prev_prompt = None

    def segment(keys: range | list[int]) -> None:
        q_start.append(len(ids))
        key_index.extend(keys)
        k_start.append(len(key_index))

    for s in samples:
        P, C = len(s.prompt_ids), len(s.completion_ids)
        if share_prompt_prefix:
            if s.prompt_ids != prev_prompt:
                prompt_at, prev_prompt = len(ids), s.prompt_ids
                ids.extend(s.prompt_ids)
                pos.extend(range(P))
                segment(range(prompt_at, prompt_at + P))
            start = len(ids)
            ids.extend(s.completion_ids)
            pos.extend(range(P, P + C))
            segment([*range(prompt_at, prompt_at + P), *range(start, start + C)])
            # the prompt's last position predicts token 0, completion position j predicts token j + 1
            predictors.extend([prompt_at + P - 1, *range(start, start + C - 1)])
        else:
            start = len(ids)
            ids.extend(s.prompt_ids + s.completion_ids)
            pos.extend(range(P + C))
            segment(range(start, start + P + C))
            predictors.extend(range(start + P - 1, start + P + C - 1))
    rows = [i for i, s in enumerate(samples) for _ in s.completion_ids]
    cols = [j for s in samples for j in range(len(s.completion_ids))]
    targets = [t for s in samples for t in s.completion_ids]

    def t(x):
        return upload(torch.tensor(x, dtype=torch.long), device)

    return PackedRow(
        input_ids=t([ids]),
        position_ids=t([pos]),
        segments=Segments(q_start, k_start, t(key_index), backend),
        predictors=t(predictors),
        targets=t([targets]),
        rows=t(rows),
        cols=t(cols),
    )


def concat(rows: list[PackedRow], counts: list[int]) -> PackedRow:
    """One row holding `rows` (of `counts` samples each) one after another, each segment still attending only within
    its own row (a sweep pack's grouped step, rl/learner/grouped.py: each job's micro-batch packed as its solo step
    packs it)."""
    n = [r.input_ids.shape[1] for r in rows]
    offsets = [sum(n[:i]) for i in range(len(rows))]
    keys = [0]
    q_start, k_start = [0], [0]
    for r, at in zip(rows, offsets):
        q_start += [q + at for q in r.segments.q_start[1:]]
        k_start += [k + keys[-1] for k in r.segments.k_start[1:]]
        keys.append(k_start[-1])
    first = rows[0]
    batch = [sum(counts[:i]) for i in range(len(rows))]
    return PackedRow(
        input_ids=torch.cat([r.input_ids for r in rows], dim=1),
        position_ids=torch.cat([r.position_ids for r in rows], dim=1),
        segments=Segments(
            q_start,
            k_start,
            torch.cat([r.segments.key_index + at for r, at in zip(rows, offsets)]),
            first.segments.backend,
        ),
        predictors=torch.cat([r.predictors + at for r, at in zip(rows, offsets)]),
        targets=torch.cat([r.targets for r in rows], dim=1),
        rows=torch.cat([r.rows + b for r, b in zip(rows, batch)]),
        cols=torch.cat([r.cols for r in rows]),
    )


def unpack(flat: torch.Tensor, row: PackedRow, shape: tuple[int, int]) -> torch.Tensor:
    """[1, T] per-token values in sample order -> [B, C] completion layout, zeros past each completion's end
    (differentiable; the loss masks those positions as it masks padding)."""
    out = flat.new_zeros(shape)
    return out.index_put((row.rows, row.cols), flat[0])


# ----------------------------------------------------------------------------------------------- attention


def packed_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention function: query [1, H, N, D], key/value [1, Hkv, N, D] -> ([1, N, H, D], None).
    Without `packed_segments` (a normal forward, e.g. generation) it is transformers' SDPA attention; with them the
    segments are the mask, and `attention_mask` (the packed forward's `mask_placeholder`) is not read."""
    segments: Segments | None = kwargs.pop("packed_segments", None)
    if segments is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if dropout:
        raise ValueError("packed attention has no attention dropout (the models it trains use none)")
    if segments.backend == "varlen":
        return _varlen(query, key, value, segments, scaling), None
    out = []
    for i in range(len(segments.q_start) - 1):
        q = query[:, :, segments.q_start[i] : segments.q_start[i + 1]]
        idx = segments.key_index[segments.k_start[i] : segments.k_start[i + 1]]
        k, v = key.index_select(2, idx), value.index_select(2, idx)
        Lq, Lk = q.shape[2], k.shape[2]
        # the queries are the last Lq keys: causal aligned at the end (SDPA's is_causal aligns at the start)
        mask = None if Lq == Lk else torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(Lk - Lq)
        out.append(
            torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, scale=scaling, enable_gqa=k.shape[1] != q.shape[1]
            )
        )
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def _varlen(query, key, value, segments: Segments, scaling):
    """One varlen flash call over the row; keys gathered per segment (a shared prompt's keys repeated, not
    recomputed), causal aligned at each segment's end (flash-attn >= 2.1 and torch's varlen_attn do so)."""
    q = query[0].transpose(0, 1)  # [N, H, D]
    k = key[0].transpose(0, 1).index_select(0, segments.key_index)  # [K, Hkv, D]
    v = value[0].transpose(0, 1).index_select(0, segments.key_index)
    cu_q, cu_k, max_q, max_k = segments.cu_seqlens(q.device)
    kernel = varlen_kernel()
    if kernel == "flash_attn":
        from flash_attn import flash_attn_varlen_func

        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scaling, causal=True)
    else:
        from torch.nn.attention.varlen import varlen_attn

        kwargs = {}
        if k.shape[1] != q.shape[1]:  # grouped-query attention
            if "enable_gqa" in inspect.signature(varlen_attn).parameters:
                kwargs["enable_gqa"] = True
            else:  # torch < 2.13 (2.11 on the GPU machine): each KV head repeated for its query heads
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out = varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scaling, window_size=(-1, 0), **kwargs)
    return out.unsqueeze(0)  # [1, N, H, D]


def varlen_kernel() -> str | None:
    """The varlen flash kernel this process can use: "flash_attn" (the package), "torch" (torch's varlen_attn with a
    causal window), or None (no CUDA, or neither)."""
    if not torch.cuda.is_available():
        return None
    try:
        import flash_attn  # noqa: F401

        return "flash_attn"
    except ImportError:
        pass
    try:
        from torch.nn.attention.varlen import varlen_attn

        return "torch" if "window_size" in inspect.signature(varlen_attn).parameters else None
    except ImportError:
        return None


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype) -> str:
    """`learner.packed_attention` auto|sdpa|varlen -> sdpa or varlen for this process: varlen needs a kernel, and flash
    kernels take 16-bit inputs only."""
    half = dtype in (torch.bfloat16, torch.float16)
    if name == "sdpa" or (name == "auto" and (device.type != "cuda" or varlen_kernel() is None or not half)):
        return "sdpa"
    if varlen_kernel() is None or not half:
        raise RuntimeError(
            "learner.packed_attention=varlen needs CUDA, flash-attn (or torch's varlen_attn) in the learner's process and a "
            f"16-bit learner (model.learner_dtype; this one computes in {dtype}): fix that, or set learner.packed_attention=sdpa"
        )
    return "varlen"


def _mask_for(**kwargs):
    """transformers' mask for ATTENTION: SDPA's when the caller passed a padding mask, none otherwise (a packed row
    has no padding; its segments are the mask)."""
    if kwargs.get("attention_mask") is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(**kwargs)


def use_packed_attention(model) -> None:
    """Switch `model` (a transformers model, PEFT-wrapped or not) to ATTENTION."""
    try:
        switch_attention(model, ATTENTION, packed_attention, _mask_for)
    except ImportError as e:
        import transformers

        raise RuntimeError(
            f"learner.micro_batch_tokens>0 needs transformers' attention and mask registries (transformers >= 4.53; "
            f"this is {transformers.__version__}): upgrade transformers, or set learner.micro_batch_tokens=0"
        ) from e
