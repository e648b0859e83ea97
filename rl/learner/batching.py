"""From TrainSamples to the logits and logprobs the loss needs: padding or packing, micro-batches, the shared-prompt
forward. Packed rows (padding-free) are built in packing.py; this module turns either layout into the loss's
completion-aligned [B, C] tensors.

Pure functions of a model and token ids (no optimizer, no config). The learner never re-tokenises text: samples
carry the prompt and completion token ids exactly as the rollout engine produced them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rl.learner import packing
from rl.learner.transfer import upload
from rl.types import TrainSample


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *, min_p: float = 0.0, with_entropy=False
):
    """log softmax(logits / T) gathered at targets. logits [B, T, V], targets [B, T] -> [B, T] (float32).
    `min_p` > 0: of the distribution a min-p sampler draws from (vLLM's processed logprobs, Sampling.min_p): the
    tokens less likely than min_p x the likeliest one are left out of the normaliser (one more [B, T, V] temporary).

    Computed as logit[target] - logsumexp(logits): the same value as gathering from log_softmax, without a second
    [B, T, V] float32 tensor (the vocabulary dimension dominates the learner's activation memory).
    with_entropy: also return the full-distribution entropy per position (no gradient, a metric), reusing the
    logsumexp: H = lse - sum_v exp(z_v - lse) z_v, one pass over the vocabulary instead of a second softmax. Row by
    row, so it adds one row's [T, V] temporaries to the peak memory."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, 2, targets.unsqueeze(-1)).squeeze(-1)
    lse = torch.logsumexp(logits, dim=-1)
    kept_lse = lse
    if min_p > 0:  # p_v < min_p * p_max  <=>  z_v < z_max + log(min_p), the same test as vLLM's MinPLogitsProcessor
        floor = logits.amax(dim=-1, keepdim=True) + math.log(min_p)
        kept_lse = torch.logsumexp(logits.masked_fill(logits < floor, float("-inf")), dim=-1)
    if not with_entropy:
        return picked - kept_lse
    with torch.no_grad():
        z, m = logits.detach(), lse.detach()
        entropy = torch.cat(
            [lr - (torch.exp(zr - lr[..., None]) * zr).sum(-1) for zr, lr in zip(z.split(1), m.split(1))]
        )
    return picked - kept_lse, entropy  # the entropy is of the whole distribution (a metric, or the bonus's term)


def position_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, *, min_p: float = 0.0, entropy: str = "none"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position logprobs [B, K] of `targets` under `logits` [B, K, V], and the token entropy [B, K] or None.
    entropy: "none"; "metric" (no gradient, from the same logsumexp); "loss" (with its gradient, for an entropy
    bonus)."""
    if entropy == "loss":
        from rl.algorithms import token_entropy

        logp = token_logprobs(logits, targets, temperature, min_p=min_p)
        return logp, token_entropy(logits.float() / temperature)
    if entropy == "metric":
        return token_logprobs(logits, targets, temperature, min_p=min_p, with_entropy=True)
    return token_logprobs(logits, targets, temperature, min_p=min_p), None


def loss_tokens(samples: list[TrainSample]) -> int:
    """Completion tokens that carry loss (the loss mask's ones, or every completion token without a mask)."""
    return sum(sum(s.loss_mask) if s.loss_mask else len(s.completion_ids) for s in samples)


def to_host(values: dict) -> dict[str, float]:
    """{name: float or 0-d tensor} -> {name: float}, every device scalar in one transfer (one sync)."""
    names = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in values.items() if k not in names}
    if names:
        out.update(zip(names, torch.stack([values[k].detach().float().reshape(()) for k in names]).tolist()))
    return {k: out[k] for k in values}


def micro_batches(samples: list[TrainSample], size: int, share_prompt_prefix: bool) -> list[list[TrainSample]]:
    """At most `size` samples each. Consecutive samples with the same prompt form a group; with a shared prompt
    prefix a micro-batch never mixes groups."""
    if not share_prompt_prefix:
        return [samples[i : i + size] for i in range(0, len(samples), size)]
    out: list[list[TrainSample]] = []
    for s in samples:
        if out and len(out[-1]) < size and out[-1][0].prompt_ids == s.prompt_ids:
            out[-1].append(s)
        else:
            out.append([s])
    return out


class Batcher:
    """Tensors of a micro-batch on the learner's device, and the logprobs of its completion tokens.

    packed: None (right-padded micro-batches of `learner.micro_batch_size` samples) or the packed attention backend
    ("sdpa" / "varlen", packing.py) for micro-batches of at most `budget` tokens in one row."""

    def __init__(
        self,
        device: torch.device,
        *,
        share_prompt_prefix: bool,
        logits_to_keep: bool,
        pad_id: int = 0,
        size: int = 16,
        packed: str | None = None,
        budget: int = 0,
    ):
        self.device, self.share_prompt_prefix = device, share_prompt_prefix
        self.logits_to_keep, self.pad_id = logits_to_keep, pad_id
        self.size, self.packed, self.budget = size, packed, budget

    def micro_batches(self, samples: list[TrainSample]) -> list[list[TrainSample]]:
        if self.packed:
            return packing.pack_micro_batches(samples, self.budget, self.share_prompt_prefix)
        return micro_batches(samples, self.size, self.share_prompt_prefix)

    def logprobs(
        self,
        model: Any,
        samples: list[TrainSample],
        temperature: float = 1.0,
        *,
        min_p: float = 0.0,
        entropy: str = "none",
    ):
        """Completion-aligned token logprobs [B, C] (right-padded with zeros) under temperature and min-p (as the
        samples were drawn), token entropy [B, C] or None, and the number of token positions the forward computed.
        entropy: "none"; "metric" (no gradient, from the same logsumexp); "loss" (with its gradient, for an entropy
        bonus)."""
        shape = (len(samples), max(len(s.completion_ids) for s in samples))
        if self.packed:
            row = packing.pack(samples, self.share_prompt_prefix, self.device, self.packed)
            logits = self.row_logits(model, row)  # [1, T, V]
            targets, n_positions = row.targets, row.input_ids.shape[1]

            def to_batch(x):
                return None if x is None else packing.unpack(x, row, shape)
        else:
            logits, targets, index, n_positions = self.logits(model, samples)  # [B, K, V], [B, K], [B, C] or None

            def to_batch(x):
                # per position [B, K] -> completion-aligned [B, C]: the gather runs after the vocabulary is reduced
                return x if x is None or index is None else torch.gather(x, 1, index)

        logp, ent = position_logprobs(logits, targets, temperature, min_p=min_p, entropy=entropy)
        return to_batch(logp), to_batch(ent), n_positions

    def row_logits(self, model: Any, row: packing.PackedRow) -> torch.Tensor:
        """A packed row's logits at its predictor positions [1, T, V] (T: its completion tokens)."""
        inputs = dict(
            input_ids=row.input_ids,
            position_ids=row.position_ids,
            packed_segments=row.segments,
            attention_mask=packing.mask_placeholder(self.device),
        )
        if self.logits_to_keep:  # the LM head runs only where a completion token is predicted
            return model(**inputs, logits_to_keep=row.predictors).logits
        return model(**inputs).logits[:, row.predictors]

    def completion_batch(self, samples: list[TrainSample]):
        """Completion-aligned [B, C] loss mask and behaviour logprobs (right-padded), advantages [B], or [B, C] when
        a sample carries per-token advantages (added to its own). The tokens themselves come with the logits
        (`logprobs`), as each layout aligns them."""
        C = max(len(s.completion_ids) for s in samples)
        B = len(samples)
        mask = torch.zeros((B, C), dtype=torch.float32)
        old = torch.zeros((B, C), dtype=torch.float32)
        for i, s in enumerate(samples):
            c = len(s.completion_ids)
            mask[i, :c] = torch.tensor(s.loss_mask, dtype=torch.float32) if s.loss_mask else 1.0
            old[i, :c] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        if any(s.token_advantages for s in samples):
            per_token = torch.zeros((B, C), dtype=torch.float32)
            for i, s in enumerate(samples):
                per_token[i, : len(s.token_advantages)] = torch.tensor(s.token_advantages, dtype=torch.float32)
            adv = adv.unsqueeze(1) + per_token  # [B, C]
        return tuple(upload(x, self.device) for x in (mask, old, adv))

    def logits(self, model: Any, samples: list[TrainSample]):
        """A padded micro-batch's logits [B, K, V], the token each position predicts [B, K], the index [B, C] that
        takes per-position values to completion-aligned ones (None: the K positions are the completions), and
        the number of token positions the forward computed."""
        shared = (
            self.share_prompt_prefix
            and len(samples) > 1
            and all(s.prompt_ids == samples[0].prompt_ids for s in samples)
        )
        return self._shared_prefix_logits(model, samples) if shared else self._full_logits(model, samples)

    def _shared_prefix_logits(self, model: Any, samples: list[TrainSample]):
        """For samples that share one prompt: the prompt is run once and its KV cache repeated for the B
        completions (GRPO samples G completions per prompt, and the prompt is usually the longer part): the same
        result as B full forwards up to float rounding, with gradients flowing through the shared prompt states."""
        prompt = upload(torch.tensor([samples[0].prompt_ids]), self.device)  # [1, P]
        P, B = prompt.shape[1], len(samples)
        # only the last prompt position's logits are used (it predicts completion token 0): the LM head, the largest
        # matmul per position, skips the others in the forward and the backward
        kwargs = {"logits_to_keep": 1} if self.logits_to_keep else {}
        first = model(input_ids=prompt, use_cache=True, **kwargs)
        cache = first.past_key_values
        cache.batch_repeat_interleave(B)
        C = max(len(s.completion_ids) for s in samples)
        comp = torch.full((B, C), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, P + C), dtype=torch.long)
        attn[:, :P] = 1
        for i, s in enumerate(samples):
            comp[i, : len(s.completion_ids)] = torch.tensor(s.completion_ids)
            attn[i, P : P + len(s.completion_ids)] = 1
        positions = torch.arange(P, P + C).expand(B, C)
        comp = upload(comp, self.device)
        rest = model(
            input_ids=comp,
            attention_mask=upload(attn, self.device),
            position_ids=upload(positions, self.device),
            past_key_values=cache,
            use_cache=True,
        )
        # the last prompt position predicts completion token 0; completion position j predicts token j + 1
        logits = torch.cat([first.logits[:, -1:].expand(B, 1, -1), rest.logits[:, :-1]], dim=1)
        return logits, comp, None, P + B * C

    def _full_logits(self, model: Any, samples: list[TrainSample]):
        """One right-padded forward of prompt + completion per sample, logits from the earliest completion on."""
        seqs = [s.prompt_ids + s.completion_ids for s in samples]
        L, B = max(len(x) for x in seqs), len(samples)
        C = max(len(s.completion_ids) for s in samples)
        input_ids = torch.full((B, L + 1), self.pad_id, dtype=torch.long)  # one more column: the last target
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, ids in enumerate(seqs):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attn[i, : len(ids)] = 1
        # row i's completion starts at p_i; position t predicts token t + 1. Positions before the earliest
        # completion predict prompt tokens: the LM head skips them (`logits_to_keep`), saving its largest matmul
        # and the [B, L, V] logits over the prompt part. The logprobs are taken at every kept position and only
        # then moved to completion alignment: gathering the [B, K, V] logits instead copies them once more, and
        # that gather's backward is a scatter-add over the whole vocabulary
        starts = torch.tensor([len(s.prompt_ids) - 1 for s in samples])
        first = min(len(s.prompt_ids) for s in samples) - 1 if self.logits_to_keep else 0
        kwargs = {"logits_to_keep": L - first} if self.logits_to_keep else {}
        input_ids = upload(input_ids, self.device)
        logits = model(input_ids=input_ids[:, :L], attention_mask=upload(attn, self.device), **kwargs).logits
        targets = input_ids[:, first + 1 :]  # [B, K]
        index = upload((starts[:, None] - first + torch.arange(C)[None]).clamp(max=L - 1 - first), self.device)
        return logits, targets, index, B * L

    @torch.no_grad()
    def check_packing(self, model: Any) -> None:
        """Refuse to train when the model's attention ignores the packed layout (a backend that replaces the
        attention forward, as Unsloth does): three short sequences, packed and padded, must give the same logprobs.
        A model that mixes the sequences of a row differs by far more than the dtype's rounding."""
        samples = [
            TrainSample([5, 6, 7, 8], [9, 10, 11], [0.0] * 3, 0.0),
            TrainSample([5, 6, 7, 8], [12, 13], [0.0] * 2, 0.0),
        ]
        samples.append(TrainSample([14, 15], [16, 17, 18, 19], [0.0] * 4, 0.0))
        padded = Batcher(self.device, share_prompt_prefix=False, logits_to_keep=self.logits_to_keep)
        was_training = model.training
        model.eval()
        try:
            want = padded.logprobs(model, samples)[0]
            got = self.logprobs(model, samples)[0]
        except Exception as e:  # a forward that does not take the packed inputs (what it raises is its own)
            raise RuntimeError(
                f"learner.micro_batch_tokens>0: this model's forward does not take packed rows "
                f"({type(e).__name__}: {e}); set learner.micro_batch_tokens=0 (padded micro-batches), or "
                "model.learner_backend=peft"
            ) from e
        finally:
            model.train(was_training)
        real = self.completion_batch(samples)[0] > 0  # [B, C] within each completion (past the end: padding)
        diff = float((got - want)[real].abs().max())
        # 16-bit logits round at up to 1/8 near |logit| = 16: the two layouts may differ by that much on a token
        tol = 1e-3 if next(model.parameters()).dtype == torch.float32 else 0.25
        if not diff <= tol:
            raise RuntimeError(
                f"learner.micro_batch_tokens>0: this model's attention does not keep packed sequences apart (packed "
                f"and padded logprobs differ by {diff:.3g} > {tol:g}); set learner.micro_batch_tokens=0 (padded "
                "micro-batches), or model.learner_backend=peft"
            )
