"""Learner: policy-gradient updates on the sampled token ids, with one of three model backends.

- `peft`: transformers + PEFT LoRA; base weights in bf16/fp32, or bitsandbytes NF4 (`load_in_4bit`, CUDA only).
- `unsloth`: Unsloth's FastLanguageModel (4-bit or 16-bit base + LoRA, its offloaded gradient checkpointing);
  CUDA only. Unsloth must be the first ML import of the process: see rl/__init__.py.
- `full_finetune`: every parameter is trained (no LoRA), with either backend's model loader.

A plain class (no Ray); `rl/placement.py` wraps it as a Ray actor. It never re-tokenises text: it receives the
prompt and completion token ids exactly as the rollout engine produced them, with the behaviour logprobs.
The reference policy for a KL penalty is the same model with the adapter disabled (no second copy in memory);
a full fine-tuning learner keeps a frozen copy of the initial weights instead, built only when a KL needs it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time

import torch

from rl import algorithms
from rl.types import Adapter, PromptRollout, Sampling, TrainSample


def pick_dtype(name: str) -> torch.dtype:
    """auto = bfloat16: base weights in bf16 (PEFT keeps the LoRA weights and their optimizer state in fp32).
    On this machine's CPU (AMX/AVX512-BF16) a bf16 step took 18 s against 27 s in fp32 (SmolLM2, 64 x 80 tokens)."""
    return torch.bfloat16 if name == "auto" else getattr(torch, name)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *, with_entropy=False):
    """log softmax(logits / T) gathered at targets. logits [B, T, V], targets [B, T] -> [B, T] (float32).

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
    if not with_entropy:
        return picked - lse
    with torch.no_grad():
        z, m = logits.detach(), lse.detach()
        entropy = torch.cat(
            [lr - (torch.exp(zr - lr[..., None]) * zr).sum(-1) for zr, lr in zip(z.split(1), m.split(1))]
        )
    return picked - lse, entropy


def _loss_tokens(samples: list[TrainSample]) -> int:
    """Completion tokens that carry loss (the loss mask's ones, or every completion token without a mask)."""
    return sum(sum(s.loss_mask) if s.loss_mask else len(s.completion_ids) for s in samples)


def _to_host(values: dict) -> dict[str, float]:
    """{name: float or 0-d tensor} -> {name: float}, every device scalar in one transfer (one sync)."""
    names = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in values.items() if k not in names}
    if names:
        out.update(zip(names, torch.stack([values[k].detach().float().reshape(()) for k in names]).tolist()))
    return {k: out[k] for k in values}


BACKENDS = ("auto", "peft", "unsloth")


def resolve_backend(name: str, cuda: bool) -> str:
    """auto = unsloth when CUDA and the unsloth package are present (the fastest 4-bit LoRA path measured on the
    GPU machine, ../shared/gpu/README.md), peft otherwise. Never imports unsloth (its import patches torch)."""
    import importlib.util

    if name not in BACKENDS:
        raise ValueError(f"model.learner_backend must be one of {', '.join(BACKENDS)} (got {name!r})")
    if name != "auto":
        return name
    return "unsloth" if cuda and importlib.util.find_spec("unsloth") is not None else "peft"


class PeftLearner:
    def __init__(
        self,
        model_path: str,
        *,
        lora_rank: int = 16,
        lora_alpha: int = 32,
        lora_dropout: float = 0.0,
        lora_targets: list[str] | tuple[str, ...] = ("q_proj", "v_proj"),
        dtype: str = "auto",
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        max_grad_norm: float = 1.0,
        policy_loss: str = "clipped",
        loss_agg: str = "seq_mean_token_mean",
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float = 0.0,
        tis_cap: float = 0.0,
        skip_threshold: float = 0.0,
        loss_agg_norm_length: int = 1024,
        entropy_coef: float = 0.0,
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        temperature: float = 1.0,
        micro_batch_size: int = 16,
        share_prompt_prefix: bool = True,
        seed: int = 0,
        num_threads: int | None = None,
        trust_remote_code: bool = False,
        backend: str = "peft",
        load_in_4bit: bool = False,
        full_finetune: bool = False,
        gradient_checkpointing: bool | None = None,
        max_seq_length: int = 2048,
        keep_reference: bool | None = None,
        sync_dtype: str | None = None,
    ):
        # Ray limits an actor to its num_cpus threads; roles alternate in synchronous mode, so use every core
        torch.set_num_threads(num_threads or os.cpu_count() or 1)
        torch.manual_seed(seed)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.backend = resolve_backend(backend, self.device.type == "cuda")
        if self.device.type != "cuda" and (self.backend == "unsloth" or load_in_4bit):
            what = "model.learner_backend=unsloth" if self.backend == "unsloth" else "model.load_in_4bit=true"
            raise RuntimeError(
                f"{what} needs a CUDA GPU, and this learner has none: set model.learner_backend=peft "
                "model.load_in_4bit=false, or cluster.use_gpu=true on a GPU machine"
            )
        if full_finetune and load_in_4bit:
            raise ValueError("model.full_finetune=true cannot train 4-bit weights: set model.load_in_4bit=false")
        self.full_finetune = full_finetune
        lora = dict(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=list(lora_targets))
        build = self._build_unsloth if self.backend == "unsloth" else self._build_peft
        self.model = build(
            model_path,
            dtype=pick_dtype(dtype),
            load_in_4bit=load_in_4bit,
            lora=None if full_finetune else lora,
            gradient_checkpointing=gradient_checkpointing,
            max_seq_length=max_seq_length,
            seed=seed,
            trust_remote_code=trust_remote_code,
        )
        self.model.train()
        import inspect

        base_forward = self.model.get_base_model().forward if hasattr(self.model, "get_base_model") else None
        self._logits_to_keep = "logits_to_keep" in inspect.signature(base_forward or self.model.forward).parameters
        # the KV-cache prefix trick needs use_cache in training; Unsloth's gradient checkpointing forbids it
        share_prompt_prefix = share_prompt_prefix and not getattr(self, "_checkpointing", False)
        # full fine-tuning has no adapter to switch off: a KL (in the loss or in the reward) needs a frozen copy
        keep_reference = kl_coef > 0 if keep_reference is None else keep_reference
        self.ref_model = None
        if full_finetune and keep_reference:
            import copy

            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        self.loss_fn = algorithms.get_policy_loss(policy_loss)
        agg = algorithms.get_loss_agg(loss_agg)
        self.agg_fn = functools.partial(agg, norm_length=loss_agg_norm_length)
        self.agg_unit = getattr(agg, "unit", "seq")
        self.loss_kwargs = {
            "clip_low": clip_low,
            "clip_high": clip_high,
            "dual_clip": dual_clip,
            "tis_cap": tis_cap,
            "skip_threshold": skip_threshold,
        }
        self.kl_coef, self.kl_estimator = kl_coef, kl_estimator
        self.entropy_coef = entropy_coef
        self.max_grad_norm = max_grad_norm
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.share_prompt_prefix = share_prompt_prefix
        self.entropy_metric = True  # policy/entropy each step (bench/learner.py turns it off to time its cost)
        self.version = 0
        self.sync_dtype = getattr(torch, sync_dtype) if sync_dtype else None  # LoRA factors as sent to actors
        self.pad_id = 0
        self.world_size, self.rank = 1, 0  # data-parallel group (init_process_group)
        self.model_path, self.trust_remote_code, self.seed = model_path, trust_remote_code, seed  # for generate()

    # ------------------------------------------------------------------------------------------------ models

    def _build_peft(
        self, path, *, dtype, load_in_4bit, lora, gradient_checkpointing, max_seq_length, seed, trust_remote_code
    ):
        """transformers model (bitsandbytes NF4 base with bf16 compute when load_in_4bit) + PEFT LoRA."""
        from transformers import AutoModelForCausalLM

        kwargs: dict = {"dtype": dtype, "trust_remote_code": trust_remote_code}
        if load_in_4bit:
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.bfloat16,
                bnb_4bit_use_double_quant=True,
            )
            kwargs["device_map"] = {"": self.device}
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if not load_in_4bit:
            model = model.to(self.device)
        model.config.use_cache = False
        self._checkpointing = bool(gradient_checkpointing)
        if self._checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        if lora is None:
            return model
        from peft import LoraConfig, get_peft_model

        return get_peft_model(model, LoraConfig(**lora, task_type="CAUSAL_LM"))

    def _build_unsloth(
        self, path, *, dtype, load_in_4bit, lora, gradient_checkpointing, max_seq_length, seed, trust_remote_code
    ):
        """Unsloth FastLanguageModel (+ its LoRA with gradient checkpointing "unsloth", on by default)."""
        import sys

        if "unsloth" not in sys.modules:
            import warnings

            warnings.warn(
                "unsloth was imported after torch in this process: its patches may be incomplete "
                "(rl/__init__.py imports it first in learner actors)",
                stacklevel=2,
            )
        # Unsloth returns empty logits from a training forward unless asked (it fuses the loss with labels)
        os.environ["UNSLOTH_RETURN_LOGITS"] = "1"
        from unsloth import FastLanguageModel

        model, _ = FastLanguageModel.from_pretrained(
            model_name=path,
            max_seq_length=max_seq_length,
            dtype=dtype,
            load_in_4bit=load_in_4bit,
            full_finetuning=lora is None,
            trust_remote_code=trust_remote_code,
        )
        self._checkpointing = gradient_checkpointing is not False
        if lora is None:
            if self._checkpointing:
                model.gradient_checkpointing_enable()
            return model
        return FastLanguageModel.get_peft_model(
            model,
            **lora,
            bias="none",
            use_gradient_checkpointing="unsloth" if self._checkpointing else False,
            random_state=seed,
        )

    def _reference(self):
        """Context manager yielding the reference policy: the adapter switched off, or the frozen copy."""
        if self.ref_model is not None:
            return contextlib.nullcontext(self.ref_model)
        if self.full_finetune:
            raise RuntimeError("this full fine-tuning learner keeps no reference copy (built only when kl_coef > 0)")

        @contextlib.contextmanager
        def adapter_off():
            with self.model.disable_adapter():
                yield self.model

        return adapter_off()

    # ------------------------------------------------------------------------------------------------ batching

    def _completion_batch(self, samples: list[TrainSample]):
        """Completion-aligned [B, C] targets, loss mask and behaviour logprobs (right-padded)."""
        C = max(len(s.completion_ids) for s in samples)
        B = len(samples)
        targets = torch.full((B, C), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, C), dtype=torch.float32)
        old = torch.zeros((B, C), dtype=torch.float32)
        for i, s in enumerate(samples):
            c = len(s.completion_ids)
            targets[i, :c] = torch.tensor(s.completion_ids)
            mask[i, :c] = torch.tensor(s.loss_mask, dtype=torch.float32) if s.loss_mask else 1.0
            old[i, :c] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        dev = self.device
        return targets.to(dev), mask.to(dev), old.to(dev), adv.to(dev)

    def _shared_prefix_logits(self, samples: list[TrainSample], model=None) -> tuple[torch.Tensor, int]:
        """Logits predicting each completion token, [B, C, V], for samples that share one prompt.

        The prompt is run once and its KV cache repeated for the B completions (GRPO samples G completions per
        prompt, and the prompt is usually the longer part): the same result as B full forwards up to float
        rounding, with gradients flowing through the shared prompt states. Returns the logits and the number
        of token positions computed."""
        model = self.model if model is None else model
        prompt = torch.tensor([samples[0].prompt_ids], device=self.device)  # [1, P]
        P, B = prompt.shape[1], len(samples)
        first = model(input_ids=prompt, use_cache=True)
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
        rest = model(
            input_ids=comp.to(self.device),
            attention_mask=attn.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=cache,
            use_cache=True,
        )
        # the last prompt position predicts completion token 0; completion position j predicts token j + 1
        logits = torch.cat([first.logits[:, -1:].expand(B, 1, -1), rest.logits[:, :-1]], dim=1)
        return logits, P + B * C

    def _full_logits(self, samples: list[TrainSample], model=None) -> tuple[torch.Tensor, int]:
        """Logits predicting each completion token, [B, C, V], from one right-padded forward of prompt+completion."""
        model = self.model if model is None else model
        seqs = [s.prompt_ids + s.completion_ids for s in samples]
        L, B = max(len(x) for x in seqs), len(samples)
        C = max(len(s.completion_ids) for s in samples)
        input_ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, ids in enumerate(seqs):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attn[i, : len(ids)] = 1
        # row i's completion starts at p_i; position t predicts token t + 1. Positions before the earliest
        # completion predict prompt tokens: the LM head skips them (`logits_to_keep`), saving its largest matmul
        # and the [B, L, V] logits over the prompt part
        starts = torch.tensor([len(s.prompt_ids) - 1 for s in samples], device=self.device)
        first = int(starts.min()) if self._logits_to_keep else 0
        kwargs = {"logits_to_keep": L - first} if self._logits_to_keep else {}
        logits = model(input_ids=input_ids.to(self.device), attention_mask=attn.to(self.device), **kwargs).logits
        index = (starts[:, None] - first + torch.arange(C, device=self.device)[None]).clamp(max=L - 1 - first)
        return torch.gather(logits, 1, index[..., None].expand(B, C, logits.shape[-1])), B * L

    def _logits(self, samples: list[TrainSample], model=None) -> tuple[torch.Tensor, int]:
        model = self.model if model is None else model
        shared = (
            self.share_prompt_prefix
            and len(samples) > 1
            and all(s.prompt_ids == samples[0].prompt_ids for s in samples)
        )
        return self._shared_prefix_logits(samples, model) if shared else self._full_logits(samples, model)

    def _micro_batches(self, samples: list[TrainSample]) -> list[list[TrainSample]]:
        """Consecutive samples with the same prompt form a group; a micro-batch never mixes groups when the
        prompt prefix is shared (at most micro_batch_size samples each)."""
        if not self.share_prompt_prefix:
            return [samples[i : i + self.micro_batch_size] for i in range(0, len(samples), self.micro_batch_size)]
        out: list[list[TrainSample]] = []
        for s in samples:
            if out and len(out[-1]) < self.micro_batch_size and out[-1][0].prompt_ids == s.prompt_ids:
                out[-1].append(s)
            else:
                out.append([s])
        return out

    # ------------------------------------------------------------------------------------------------ training

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step over `samples` (gradient accumulation in micro-batches). Returns metrics."""
        t0 = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        n_tok = _loss_tokens(samples)
        # sequences with no loss token (masked truncated responses) count in no normaliser, as in the aggregations
        samples = [s for s in samples if _loss_tokens([s]) > 0]
        n_seq = len(samples)
        token_level = self.agg_unit == "token"
        if self.kl_coef == 0 and self.entropy_coef == 0:
            # A sample with advantage 0 adds exactly 0 to the policy loss and its gradient; it only counts in the
            # normaliser (n_seq / n_tok above, computed before this filter), so skipping its forward is exact.
            samples = [s for s in samples if s.advantage != 0.0]
        # data-parallel: each learner holds a shard; normalising by the counts over all shards makes the summed
        # gradient equal to one learner's gradient on the whole batch
        n_seq, n_tok, n_signal = self._all_reduce_counts(n_seq, n_tok, len(samples))
        # Loss and metrics stay on the device until the step is launched: a float() between forward and backward
        # makes the CPU wait for the forward to drain before it can queue the backward
        sums: dict[str, torch.Tensor | float] = {}
        total_loss: torch.Tensor | float = 0.0
        tokens = 0
        for mb in self._micro_batches(samples):
            targets, mask, old, adv = self._completion_batch(mb)
            logits, n_positions = self._logits(mb)
            if self.entropy_coef > 0:  # the entropy is in the loss: it needs its gradient
                logp = token_logprobs(logits, targets, self.temperature)  # [B, C]
                entropy = algorithms.token_entropy(logits.float() / self.temperature)
            elif self.entropy_metric:  # a metric only: computed from the same logsumexp, without a gradient
                logp, entropy = token_logprobs(logits, targets, self.temperature, with_entropy=True)
            else:
                logp, entropy = token_logprobs(logits, targets, self.temperature), None
            del logits
            loss, metrics = self.loss_fn(logp, old, adv, mask, agg=self.agg_fn, **self.loss_kwargs)
            if self.entropy_coef > 0:  # entropy bonus: maximise the aggregated token entropy
                loss = loss - self.entropy_coef * self.agg_fn(entropy, mask)
            if self.kl_coef > 0:
                with torch.no_grad(), self._reference() as ref_model:
                    ref = token_logprobs(self._logits(mb, ref_model)[0], targets, self.temperature)
                kl = algorithms.kl_penalty(logp, ref, self.kl_estimator)
                loss = loss + self.kl_coef * self.agg_fn(kl, mask)
                metrics["policy/kl_ref"] = algorithms.masked_mean(kl, mask)
            with torch.no_grad():
                metrics["policy/neg_logp"] = algorithms.masked_mean(-logp, mask)  # mean -log p of sampled tokens
                if entropy is not None:
                    metrics["policy/entropy"] = algorithms.masked_mean(entropy, mask)
                metrics["policy/train_infer_logp_diff"] = algorithms.masked_mean((logp - old).abs(), mask)
            # weight each micro-batch by its share of the unit the aggregation averages over (counted on the host)
            weight = _loss_tokens(mb) / max(n_tok, 1) if token_level else len(mb) / max(n_seq, 1)
            (loss * weight).backward()
            total_loss = total_loss + loss.detach() * weight
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v * weight
            tokens += n_positions
        if self.world_size > 1:
            sums = _to_host({"train/loss": total_loss, **sums})
            total_loss, sums = self._all_reduce_grads_and_metrics(sums.pop("train/loss"), sums, n_signal)
        params = [p for p in self.model.parameters() if p.requires_grad and p.grad is not None]
        if not params:
            grad_norm: torch.Tensor | float = 0.0
        elif self.max_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        else:
            grad_norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
        # the step's one wait for the device: the non-finite guard must see the loss and gradient norm
        sums = _to_host({"train/loss": total_loss, "train/grad_norm": grad_norm, **sums})
        total_loss, grad_norm = sums.pop("train/loss"), sums.pop("train/grad_norm")
        if math.isfinite(total_loss) and math.isfinite(grad_norm):
            self.optimizer.step()
            skipped = 0.0
        else:  # never let a NaN/inf step reach the weights
            self.optimizer.zero_grad(set_to_none=True)
            skipped = 1.0
        self.version += 1
        dt = time.perf_counter() - t0
        out = {k: v for k, v in sums.items()}
        out.update(
            {
                "train/loss": total_loss,
                "train/samples_with_signal": float(n_signal),
                "train/grad_norm": grad_norm,
                "train/skipped_nonfinite": skipped,
                "perf/learner_tokens_per_s": tokens / dt,
                "time/learn_s": dt,
            }
        )
        return out

    # ------------------------------------------------------------------------------------------------ generation

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[PromptRollout]:
        """Learner generation (DistRL-LLM's learner_chunk_size, `cluster.learner_chunk_size`): sample a share of
        the step's prompts with this learner's own PEFT model instead of waiting for the actors; the rollouts
        carry this learner's adapter version and the processed-distribution logprobs, as an actor's do."""
        from rl.hf_rollout import hf_generate

        if not hasattr(self, "_gen_tokenizer"):  # built on first use: most runs never generate here
            from transformers import AutoTokenizer

            self._gen_tokenizer = AutoTokenizer.from_pretrained(
                self.model_path, trust_remote_code=self.trust_remote_code
            )
            self._gen_rng = torch.Generator(device=self.device).manual_seed(self.seed + 1 + self.rank)
        self.model.eval()
        try:
            return hf_generate(self.model, self._gen_tokenizer, prompts, sampling, self._gen_rng, self.version)
        finally:
            self.model.train()

    # ------------------------------------------------------------------------------------------------ data parallel

    def init_process_group(self, address: str, port: int, world_size: int, rank: int) -> None:
        """Join the learners' torch.distributed group (gloo on CPU, NCCL on CUDA); rank 0 publishes the adapter."""
        import datetime

        import torch.distributed as dist

        dist.init_process_group(
            backend="nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"tcp://{address}:{port}",
            world_size=world_size,
            rank=rank,
            timeout=datetime.timedelta(minutes=10),
        )
        self.world_size, self.rank = world_size, rank

    def _all_reduce_counts(self, *counts: int) -> list[int]:
        if self.world_size == 1:
            return list(counts)
        import torch.distributed as dist

        t = torch.tensor(counts, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return [int(x) for x in t.tolist()]

    def _all_reduce_grads_and_metrics(
        self, loss: float, sums: dict[str, float], n_signal: int
    ) -> tuple[float, dict[str, float]]:
        """Sum the LoRA gradients and the (globally normalised, hence additive) loss and metrics over learners.

        A learner whose shard had no signal has no gradients: it adds zeros, so every learner clips and steps
        on the same summed gradient. When no learner had signal, no gradient exists anywhere and none is made
        (the optimizer then skips every parameter, as a single learner would)."""
        import torch.distributed as dist

        if n_signal > 0:
            params = [p for p in self.model.parameters() if p.requires_grad]
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat = torch.cat([p.grad.reshape(-1) for p in params])  # one collective instead of one per tensor
            dist.all_reduce(flat)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, (loss, sums))
        total: dict[str, float] = {}
        for _, part in gathered:
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
        return sum(x for x, _ in gathered), total

    def close(self) -> None:
        import torch.distributed as dist

        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------------------------------------ sync

    def get_adapter(self, for_sync: bool = False) -> Adapter:
        """The current policy update as bytes: the LoRA adapter in PEFT format (adapter_config.json +
        safetensors), or with full fine-tuning every parameter under its HF name (config `full_weights: true`;
        tied parameters once, as `named_parameters` lists them). `for_sync`: the LoRA factors in `sync_dtype`
        (the rollout engine's, which rounds them to it on load anyway: half the bytes for a bf16 engine); saved
        adapters and checkpoints keep the training precision."""
        from safetensors.torch import save

        if self.full_finetune:
            state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.named_parameters()}
            config = {"full_weights": True, "dtype": str(next(iter(state.values())).dtype).removeprefix("torch.")}
            return Adapter(version=self.version, config=config, weights=save(state))
        from peft import get_peft_model_state_dict

        state = {k: v.detach().to("cpu").contiguous() for k, v in get_peft_model_state_dict(self.model).items()}
        if for_sync and self.sync_dtype is not None:
            state = {k: v.to(self.sync_dtype) if v.is_floating_point() else v for k, v in state.items()}
        config = self.model.peft_config["default"].to_dict()
        config["target_modules"] = sorted(config["target_modules"])  # a set in PEFT; JSON needs a list
        return Adapter(version=self.version, config=config, weights=save(state))

    def get_version(self) -> int:
        return self.version

    def ipc_weights(self) -> dict:
        """Every parameter as a CUDA IPC handle, in the update format of vLLM's IPC weight-transfer engine
        (names, dtype names, shapes, {GPU uuid: rebuild args}); the tensors stay referenced (valid) until
        `release_ipc_weights`. For full fine-tuning with actors on the same GPU (cluster.weight_sync=ipc)."""
        from torch.multiprocessing.reductions import reduce_tensor

        if self.device.type != "cuda":
            raise RuntimeError("cluster.weight_sync=ipc needs the learner on a CUDA GPU")
        uuid = str(torch.cuda.get_device_properties(self.device.index or torch.cuda.current_device()).uuid)
        self._ipc_refs = []
        info: dict = {"names": [], "dtype_names": [], "shapes": [], "ipc_handles": []}
        for name, p in self.model.named_parameters():
            t = p.detach().contiguous()
            self._ipc_refs.append(t)
            info["names"].append(name)
            info["dtype_names"].append(str(t.dtype).removeprefix("torch."))
            info["shapes"].append(list(t.shape))
            info["ipc_handles"].append({uuid: reduce_tensor(t)[1]})
        return info

    def release_ipc_weights(self) -> None:
        self._ipc_refs = []
        torch.cuda.ipc_collect()

    def state_dict(self) -> dict:
        """What a checkpoint needs to continue training exactly, as plain data (crosses Ray): the adapter (its
        version included), the AdamW state (torch.save bytes) and this process's torch generator state."""
        import io

        buf = io.BytesIO()
        torch.save(self.optimizer.state_dict(), buf)
        return {
            "adapter": self.get_adapter(),
            "optimizer": buf.getvalue(),
            "torch_rng": torch.get_rng_state().numpy().tobytes(),
        }

    def load_state(self, state: dict) -> None:
        """Restore `state_dict()`'s output: LoRA weights copied in place (the optimizer keeps its parameters)."""
        import io

        from peft import set_peft_model_state_dict
        from safetensors.torch import load

        adapter = state["adapter"]
        weights = {k: v.to(self.device) for k, v in load(adapter.weights).items()}
        if self.full_finetune:
            missing = set(weights) ^ {k for k, _ in self.model.named_parameters()}
            if missing:
                raise ValueError(f"checkpoint weights do not match this model: {sorted(missing)[:5]} ...")
            with torch.no_grad():
                for k, p in self.model.named_parameters():
                    p.copy_(weights[k])
        else:
            set_peft_model_state_dict(self.model, weights)
        opt = torch.load(io.BytesIO(state["optimizer"]), map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(opt)
        self.version = adapter.version
        torch.set_rng_state(torch.frombuffer(bytearray(state["torch_rng"]), dtype=torch.uint8))

    def adapter_checksum(self) -> float:
        """Sum of all LoRA parameters (float64): equal across learners means equal adapters (up to collisions)."""
        return float(sum(p.detach().double().sum() for p in self.model.parameters() if p.requires_grad))

    @torch.no_grad()
    def sequence_logprobs(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], reference: bool = False
    ) -> list[list[float]]:
        """Logprobs of given completions under the current policy, or under the reference policy (the adapter
        disabled) with `reference=True`; for the sync probe and a KL penalty folded into the reward."""
        self.model.eval()
        samples = [TrainSample(p, c, [0.0] * len(c), 0.0) for p, c in zip(prompt_ids, completion_ids)]
        out: list[list[float]] = []
        with self._reference() if reference else contextlib.nullcontext(self.model) as model:
            for mb in self._micro_batches(samples):
                targets, _, _, _ = self._completion_batch(mb)
                logp = token_logprobs(self._logits(mb, model)[0], targets, self.temperature)
                out.extend(logp[i, : len(s.completion_ids)].tolist() for i, s in enumerate(mb))
        self.model.train()
        return out
