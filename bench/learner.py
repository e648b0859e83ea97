"""Learner step: ours (rl.learner.Learner.train_step on TrainSamples) against a raw PEFT step on the same
sequences, LoRA rank/targets, dtype and micro-batches, in one process run (both sides under the same load).

CPU (about 3 min with --groups 4, 6 with the default 8, on the shared 2-core machine):  python -m bench.learner
CUDA, random Qwen2.5-0.5B shape:  python -m bench.learner --device cuda --shape qwen2.5-0.5b --groups 16 \
    --prompt-len 128 --completion-len 64:256

Raw step: right-padded forward of prompt+completion, token-mean cross-entropy on the completion tokens (only
their logits upcast to fp32, as ours), backward, grad-norm clip, AdamW step (a lean hand-written PEFT loop: no
behaviour logprobs, no clipping ratio, no entropy or other metrics).
Ours runs twice: `share_prompt_prefix=False` (the same full forward as raw: the ratio is our overhead) and the
default `share_prompt_prefix=True` (each group's prompt run once: what a user gets). kl_coef=0 on our side (the
demo's GRPO adds a no-grad reference forward; that is more work, not overhead). Token ids are random (speed does
not depend on them); lengths default to the demo's (8 prompts x 8 completions, 57-token prompts, 10-40 tokens).

Backend: transformers + PEFT (CPU or CUDA). The GPU backends (Unsloth 4-bit, PEFT + bitsandbytes 4-bit, PEFT bf16)
against each library's own step are bench/learner_backends.py (measured on the H200, README).
"""

from __future__ import annotations

import argparse
import json
import random
import time

from bench.common import (
    LORA_TARGETS,
    add_model_args,
    learner_spec,
    machine,
    machine_label,
    median,
    model_path,
    set_threads,
)


def make_samples(args):
    from rl.types import TrainSample

    lo, hi = (int(x) for x in args.completion_len.split(":"))
    rng = random.Random(0)
    vocab = args.vocab
    out = []
    for _ in range(args.groups):
        prompt = [rng.randrange(100, vocab) for _ in range(args.prompt_len)]
        for _ in range(args.group_size):
            n = rng.randrange(lo, hi + 1)
            comp = [rng.randrange(100, vocab) for _ in range(n)]
            out.append(TrainSample(prompt, comp, [-1.0] * n, rng.gauss(0, 1)))
    return out


# ------------------------------------------------------------------------------------------------ ours


def build_ours(args, path: str, *, share_prompt_prefix: bool):
    """Our learner; returns an object whose `train_step(samples)` is timed."""
    from rl.learner import Learner

    spec = learner_spec(
        path,
        f"micro_batch_size={args.micro_batch_size}",
        f"share_prompt_prefix={share_prompt_prefix}",
        rank=args.rank,
        dtype=args.dtype,
        threads=args.threads,
    )
    return Learner(spec)


def without_entropy_metric(learner):
    """Our learner without the policy/entropy metric's extra pass over the vocabulary (to time what it costs)."""
    from rl.learner.batching import token_logprobs

    t = learner.spec.loss.temperature
    learner._logprobs = lambda logits, targets: (token_logprobs(logits, targets, t), None)
    return learner


# ------------------------------------------------------------------------------------------------ raw


class RawPeftStep:
    """A hand-written LoRA step: full forward, completion-token cross-entropy, backward, AdamW."""

    def __init__(self, model, args):
        import torch

        self.model = model
        self.model.train()
        self.device = next(model.parameters()).device
        self.mb = args.micro_batch_size
        params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)

    def train_step(self, samples) -> dict:
        import torch

        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        n_tok = sum(len(s.completion_ids) for s in samples)
        for i in range(0, len(samples), self.mb):
            batch = samples[i : i + self.mb]
            seqs = [s.prompt_ids + s.completion_ids for s in batch]
            L = max(map(len, seqs))
            ids = torch.zeros((len(batch), L), dtype=torch.long)
            attn = torch.zeros_like(ids)
            labels = torch.full_like(ids, -100)
            for j, (s, seq) in enumerate(zip(batch, seqs)):
                ids[j, : len(seq)] = torch.tensor(seq)
                attn[j, : len(seq)] = 1
                labels[j, len(s.prompt_ids) : len(seq)] = torch.tensor(s.completion_ids)
            logits = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device)).logits
            # only the completion positions go through the fp32 log-softmax (as ours does): position t predicts t + 1
            target = labels[:, 1:].to(self.device)
            keep = target != -100
            loss = torch.nn.functional.cross_entropy(logits[:, :-1][keep].float(), target[keep], reduction="sum")
            (loss / n_tok).backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
        self.opt.step()
        return {"time/learn_s": time.perf_counter() - t0}


def build_raw(args, path: str) -> RawPeftStep:
    """The raw PEFT step: transformers model + PEFT LoRA, as PEFT documents it."""
    import torch
    from peft import LoraConfig, get_peft_model

    set_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "auto" else getattr(torch, args.dtype)
    lora = LoraConfig(
        r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device)
    model.config.use_cache = False
    torch.manual_seed(0)
    return RawPeftStep(get_peft_model(model, lora), args)


# ------------------------------------------------------------------------------------------------ timing


def time_round_robin(learners: dict, samples, repeats: int) -> dict[str, float]:
    """Median step time of each learner, timed in turns (raw, ours, ours, raw, ...) so that a change in the
    machine's load hits every side alike; one warm-up step each first (allocations, optimizer state)."""
    for learner in learners.values():
        learner.train_step(samples)
    times: dict[str, list[float]] = {k: [] for k in learners}
    for _ in range(repeats):
        for side, learner in learners.items():
            t0 = time.perf_counter()
            learner.train_step(samples)
            _sync()
            times[side].append(time.perf_counter() - t0)
    return {k: median(v) for k, v in times.items()}


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=57)
    ap.add_argument("--completion-len", default="10:40")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--probe-entropy", action="store_true", help="also time ours without the entropy metric")
    args = ap.parse_args()

    from transformers import AutoConfig

    path = model_path(args)
    args.vocab = min(AutoConfig.from_pretrained(path).vocab_size, 32000)
    samples = make_samples(args)
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    before = machine()
    learners, build_s = {}, {}
    sides = ["raw", "ours_full", "ours_shared"] + (["ours_full_no_entropy"] if args.probe_entropy else [])
    for side in sides:  # all in memory at once (a LoRA learner of SmolLM2 is ~0.6 GB)
        t0 = time.perf_counter()
        if side == "raw":
            learners[side] = build_raw(args, path)
        else:
            learners[side] = build_ours(args, path, share_prompt_prefix=side == "ours_shared")
        if side == "ours_full_no_entropy":  # where the overhead goes: the policy/entropy metric's extra pass
            learners[side] = without_entropy_metric(learners[side])
        build_s[side] = time.perf_counter() - t0
    step_s = time_round_robin(learners, samples, args.repeats)
    rows = {
        side: {"step_s": round(step_s[side], 3), "tokens_per_s": round(tokens / step_s[side], 1), "build_s": round(b)}
        for side, b in build_s.items()
    }
    info = machine()
    info["load_avg_before"] = before["load_avg"]
    work = {
        "model": args.shape or args.model,
        "backend": "peft",
        "samples": len(samples),
        "tokens": tokens,
        "rank": args.rank,
        "dtype": args.dtype,
        "device": args.device,
        "micro_batch_size": args.micro_batch_size,
        "threads": args.threads,
    }
    overhead = rows["ours_full"]["step_s"] / rows["raw"]["step_s"]
    speedup = rows["raw"]["step_s"] / rows["ours_shared"]["step_s"]
    if "ours_full_no_entropy" in rows:
        share = 1 - rows["ours_full_no_entropy"]["step_s"] / rows["ours_full"]["step_s"]
        print(json.dumps({"bench": "learner", "entropy_metric_share_of_ours_full": round(share, 3)}))
    for side, row in rows.items():
        print(json.dumps({"bench": "learner", "side": side, **work, **row, "machine": info}), flush=True)
    print(
        json.dumps(
            {
                "bench": "learner",
                "overhead_ours_full_over_raw": round(overhead, 3),
                "raw_over_ours_shared": round(speedup, 2),
            }
        )
    )
    print(
        f"| learner step: {work['model']} peft {args.dtype}, {len(samples)} samples "
        f"({args.groups} prompts x {args.group_size}), LoRA r={args.rank} | raw PEFT {rows['raw']['step_s']:.2f} s "
        f"({rows['raw']['tokens_per_s']:.0f} tok/s) | ours, full forward {rows['ours_full']['step_s']:.2f} s "
        f"(overhead **{overhead:.2f}x**) | ours, shared prompt (default) {rows['ours_shared']['step_s']:.2f} s "
        f"(raw / ours **{speedup:.2f}x**) | {machine_label(info)} |"
    )


if __name__ == "__main__":
    main()
