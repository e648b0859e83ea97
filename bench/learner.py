"""Learner step: ours (rl.learner.Learner.train_step on TrainSamples), padded or packed, against a raw PEFT step on
the same sequences, LoRA rank/targets and dtype; each side in a fresh process, one after the other, `--repeats`
timed steps each after one warm-up; medians with their spread.

CPU (about 6 min on the shared 2-core machine):  python -m bench.learner --threads 1 --groups 4
Packed vs padded at a wide length spread:  python -m bench.learner --threads 1 --groups 2 --completion-len 20:500 \
    --sides ours_full,ours_shared,ours_packed,ours_packed_shared
CUDA, random Qwen2.5-0.5B shape:  python -m bench.learner --device cuda --shape qwen2.5-0.5b --groups 16 \
    --prompt-len 128 --completion-len 20:1000 --micro-batch-tokens 16384 (add --packed-attention varlen|sdpa)
A sweep pack's learner, grouped vs job after job:  python -m bench.learner --threads 1 --groups 2 --jobs 4 \
    --sides ours_pack_grouped,ours_pack_each

Raw step: right-padded forward of prompt+completion, token-mean cross-entropy on the completion tokens (only
their logits upcast to fp32, as ours), backward, grad-norm clip, AdamW step (a lean hand-written PEFT loop: no
behaviour logprobs, no clipping ratio, no entropy or other metrics).
Our sides: `ours_full` (padded micro-batches of --micro-batch-size, full forward as raw: the ratio is our
overhead), `ours_shared` (padded, each group's prompt run once through the KV cache: today's default),
`ours_packed` and `ours_packed_shared` (`learner.micro_batch_tokens`: rows of up to --micro-batch-tokens tokens without
padding, rl/learner/packing.py; the second with each prompt once per row), `ours_full_no_entropy` (what the entropy
metric costs), `ours_full_peft_switch` (ours_full with its KL reference's adapter switched off by PEFT's
`disable_adapter()`, which walks every LoRA layer's parameters, instead of the layers' own switches),
`ours_shared_sdpa` (ours_shared with SDPA everywhere instead of the CPU learner's eager attention for short
sequences, rl/learner/attention.py). kl_coef=0 on our sides unless `--kl` (the demo's GRPO, 0.01, adds a
no-grad reference forward; that is more work, not overhead). `--profile N` adds one profiled step per side and
prints its top N ops by self time (CUDA time on a GPU); `--ops` counts the torch ops one step dispatches
(bench.common.dispatched_ops; on a CPU, what a launch-bound GPU step pays per op). Tokens/s = prompt + completion
tokens of the samples / step time, the same numerator for every side (a pack side: all N jobs' samples).
Sweep-pack sides: `--jobs` N jobs as N LoRA adapters on one base (rl/runtime/packed.py PackedRole), built as
`ours_full` (full rows, as the grouped step runs them) with run.seed=j and lr 1e-5*(j+1); a timed step is every
job's step, each on samples of its own (the same shapes, seed j). `ours_pack_grouped` runs them as one grouped step
(rl/learner/grouped.py: a forward and backward per micro-batch over every job's rows, or per --pack-micro-batches of
each job's; the side fails, saying why, if the learner did not group them), `ours_pack_each` as N solo steps one
after another; `pack_grouped_over_each` (each's step time over grouped's) is the grouped step's gain.
Token ids are random (speed does not depend on them); lengths default to the demo's (8 prompts x 8 completions,
57-token prompts, 10-40 tokens).

Backend: `peft` (transformers + PEFT, CPU or CUDA), or `--backend unsloth`, the GPU demo's Unsloth 4-bit learner (our
sides only), e.g. a pack's grouped step as the demo runs it: python -m bench.learner --device cuda --backend unsloth
--groups 32 --group-size 16 --micro-batch-size 64 --jobs 8 --sides ours_pack_grouped,ours_pack_each --profile 25.
The GPU backends (Unsloth 4-bit, PEFT + bitsandbytes 4-bit, PEFT bf16) against each library's own step are
bench/learner_backends.py (measured on the H200, README).

Past 400 lines because every side's learner (ours, the raw PEFT step, a pack's two ways) is built here, beside the one
timing, profiling and op count that must treat them alike.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from bench.common import (
    LORA_TARGETS,
    add_model_args,
    append_result,
    dispatched_ops,
    learner_config,
    machine,
    machine_label,
    model_path,
    peak_gib,
    profiled_step,
    run_side_process,
    set_threads,
    show_spread,
    spread,
)


def make_samples(args, seed: int = 0):
    from rl.types import TrainSample

    lo, hi = (int(x) for x in args.completion_len.split(":"))
    rng = random.Random(seed)
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


def ours_args(args, path: str, *, share_prompt_prefix: bool, packed: bool = False, seed: int = 0, lr=None) -> dict:
    """Our learner's constructor arguments for the bench's settings (`lr` None: the config's default)."""
    from rl.app import learner_args

    # peft: the raw side's library (`auto` would take Unsloth on a GPU that has it); unsloth: the GPU demo's learner
    unsloth = ["model.learner_backend=unsloth", "model.load_in_4bit=true"]
    cfg = learner_config(
        path,
        *(unsloth if args.backend == "unsloth" else ["model.learner_backend=peft"]),
        f"learner.micro_batch_size={args.micro_batch_size}",
        f"learner.micro_batch_tokens={args.micro_batch_tokens if packed else 0}",
        f"learner.packed_attention={args.packed_attention}",
        f"learner.share_prompt_prefix={share_prompt_prefix}",
        f"learner.pack_micro_batches={args.pack_micro_batches}",
        f"cluster.use_gpu={args.device == 'cuda'}",
        f"algorithm.kl_coef={args.kl}",
        *([f"algorithm.lr={lr}"] if lr is not None else []),
        rank=args.rank,
        dtype=args.dtype,
        seed=seed,
        threads=args.threads,
    )
    return learner_args(cfg)


def build_ours(args, path: str, *, share_prompt_prefix: bool, packed: bool = False):
    """Our learner; returns an object whose `train_step(samples)` is timed."""
    from rl.learner import Learner

    return Learner(**ours_args(args, path, share_prompt_prefix=share_prompt_prefix, packed=packed))


def without_entropy_metric(learner):
    """Our learner without the policy/entropy metric's extra pass over the vocabulary (to time what it costs)."""
    from rl.learner.batching import token_logprobs

    t = learner.algorithm.temperature
    learner._logprobs = lambda logits, targets: (token_logprobs(logits, targets, t), None)
    return learner


def with_peft_reference_switch(learner):
    """Our learner with its KL reference's adapter switched off by PEFT's `model.disable_adapter()` instead of the
    layers' own switches (rl/learner/models.py `_adapter_off`), to time what the direct switch saves a step."""
    import contextlib

    model = learner.model

    @contextlib.contextmanager
    def peft_switch():
        with model.disable_adapter():
            yield model

    learner.policy.reference = peft_switch
    return learner


# ------------------------------------------------------------------------------------------------ a pack's jobs

PACK_SIDES = ("ours_pack_grouped", "ours_pack_each")


def job_lr(job: int) -> float:
    """Job `job`'s learning rate: each job its own, as a sweep's jobs differ."""
    return 1e-5 * (job + 1)


class PackSteps:
    """A PackedRole learner of one job per `jobs` entry (constructor arguments); `train_step(batches)` steps job j on
    `batches[j]`, all jobs in one grouped step (`grouped`) or one solo step per job, and returns one dict:
    `train/micro_batches` (forwards per step: the jobs' most when grouped, their sum otherwise),
    `pack/grouped_jobs` (the jobs that shared each forward) and the jobs' largest `memory/learner_peak_gb`."""

    def __init__(self, jobs: list[dict], *, grouped: bool):
        from rl.learner import Learner
        from rl.runtime.packed import PackedRole

        if len(jobs) < 2:
            raise SystemExit(f"--jobs {len(jobs)}: the pack sides need at least 2 jobs (a grouped step of one is solo)")
        self.role = PackedRole(Learner, jobs)
        self.grouped = grouped

    def train_step(self, batches: list[list]) -> dict[str, float]:
        from rl.types import JobError

        n = len(batches)
        if self.grouped:
            # a job's step that raised stops the bench with its error
            results = self.role.train_jobs([(job, (samples,)) for job, samples in enumerate(batches)])
            metrics = [JobError.unwrap(m) for m in results]
            shared = min(m["pack/grouped_jobs"] for m in metrics)
            if shared != n:  # the learner stepped them one after another: the side would time the wrong thing
                why = getattr(self.role.role, "grouped_refusal", None) or "no reason recorded"
                raise SystemExit(f"ours_pack_grouped: the learner did not group the {n} jobs' steps: {why}")
        else:
            metrics = [self.role.on_job(job, "train_step", samples) for job, samples in enumerate(batches)]
            shared = 1.0
        forwards = [m.get("train/micro_batches", 0) for m in metrics]
        out = {"train/micro_batches": max(forwards) if self.grouped else sum(forwards), "pack/grouped_jobs": shared}
        peaks = [m["memory/learner_peak_gb"] for m in metrics if "memory/learner_peak_gb" in m]
        return out | ({"memory/learner_peak_gb": max(peaks)} if peaks else {})


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

SIDES = [
    "raw",
    "ours_full",
    "ours_shared",
    "ours_packed",
    "ours_packed_shared",
    "ours_full_no_entropy",
    "ours_full_peft_switch",
    "ours_shared_sdpa",
    *PACK_SIDES,
]


def build_side(side: str, args, path: str):
    if side == "raw":
        return build_raw(args, path)
    if side in PACK_SIDES:  # full rows, as the grouped step runs them (rl/learner/grouped.py)
        jobs = [ours_args(args, path, share_prompt_prefix=False, seed=j, lr=job_lr(j)) for j in range(args.jobs)]
        return PackSteps(jobs, grouped=side == "ours_pack_grouped")
    packed = side.startswith("ours_packed")
    learner = build_ours(args, path, share_prompt_prefix="shared" in side, packed=packed)
    if side == "ours_full_peft_switch":
        return with_peft_reference_switch(learner)
    if side == "ours_shared_sdpa":  # the CPU learner's short-sequence eager attention off (rl/learner/attention.py)
        learner.model.get_base_model().set_attn_implementation("sdpa")
    # where the overhead goes: the policy/entropy metric's extra pass
    return without_entropy_metric(learner) if side == "ours_full_no_entropy" else learner


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_side(args) -> dict:
    """This process builds one side, runs one warm-up step (allocations, optimizer state), then times `repeats`."""
    from transformers import AutoConfig

    path = model_path(args)
    args.vocab = min(AutoConfig.from_pretrained(path).vocab_size, 32000)
    pack = args.side in PACK_SIDES
    # a pack side's step is every job's step, each on samples of its own (the same shapes, another seed)
    work = [make_samples(args, seed=j) for j in range(args.jobs)] if pack else make_samples(args)
    samples = [s for batch in work for s in batch] if pack else work
    before = machine()
    t0 = time.perf_counter()
    learner = build_side(args.side, args, path)
    build_s = time.perf_counter() - t0
    steps = [learner.train_step(work)]
    _sync()
    step_s = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        steps.append(learner.train_step(work))
        _sync()
        step_s.append(round(time.perf_counter() - t0, 3))
    metrics = steps[-1]
    table = profiled_step(lambda: learner.train_step(work), args.profile) if args.profile else None
    ops = dispatched_ops(lambda: learner.train_step(work)) if args.ops else None
    info = machine()
    info["load_avg_before"] = before["load_avg"]
    if args.device == "cuda":
        info["peak_gib"] = round(peak_gib(steps), 2)
    completions = [len(s.completion_ids) for s in samples]
    return {
        "bench": "learner",
        "side": args.side,
        "model": args.shape or args.model,
        "backend": args.backend,
        "jobs": args.jobs if pack else 1,
        "samples": len(samples),
        "tokens": sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples),
        "completion_len": [min(completions), max(completions)],
        "rank": args.rank,
        "dtype": args.dtype,
        "device": args.device,
        "micro_batch_size": args.micro_batch_size,
        "micro_batch_tokens": args.micro_batch_tokens if args.side.startswith("ours_packed") else 0,
        **({"pack_micro_batches": args.pack_micro_batches} if pack else {}),
        "threads": args.threads,
        "build_s": round(build_s, 1),
        "step_s": step_s,
        "micro_batches": metrics.get("train/micro_batches"),  # forwards per step (ours; None for raw)
        **({"grouped_jobs": metrics["pack/grouped_jobs"]} if pack else {}),
        "machine": info,
        **({"profile": table} if table else {}),
        **({"ops": ops} if ops is not None else {}),
    }


def compare(args) -> None:
    """Each side in a fresh process, one after the other; medians, spreads, ratios of medians, a markdown row."""
    if args.backend == "unsloth" and ("raw" in args.sides.split(",") or args.device != "cuda"):
        raise SystemExit("--backend unsloth: a CUDA learner of our sides only (drop `raw` from --sides, --device cuda)")
    rows = {}
    for side in args.sides.split(","):
        if side not in SIDES:
            raise SystemExit(f"--sides: unknown side {side!r} (choose from {', '.join(SIDES)})")
        rows[side] = run_side_process("bench.learner", side, sys.argv[1:])
        rows[side]["tokens_per_s"] = spread([rows[side]["tokens"] / t for t in rows[side]["step_s"]])
        table = rows[side].pop("profile", None)
        print(json.dumps(rows[side]), flush=True)
        if table:
            print(f"profile of one {side} step:\n{table}", flush=True)
    tok = {side: row["tokens_per_s"]["median"] for side, row in rows.items()}
    pairs = {  # (faster?, slower?): the ratio of their median tokens/s
        "ours_full_over_raw": ("ours_full", "raw"),
        "ours_shared_over_raw": ("ours_shared", "raw"),
        "packed_over_padded": ("ours_packed", "ours_full"),
        "packed_shared_over_padded_shared": ("ours_packed_shared", "ours_shared"),
        "packed_shared_over_packed": ("ours_packed_shared", "ours_packed"),
        "no_entropy_over_full": ("ours_full_no_entropy", "ours_full"),
        "direct_switch_over_peft_switch": ("ours_full", "ours_full_peft_switch"),
        "short_eager_over_sdpa": ("ours_shared", "ours_shared_sdpa"),
        "pack_grouped_over_each": ("ours_pack_grouped", "ours_pack_each"),  # the same tokens: each's s / grouped's
    }
    ratios = {k: round(tok[a] / tok[b], 2) for k, (a, b) in pairs.items() if a in tok and b in tok}
    first = next(iter(rows.values()))
    print(json.dumps({"bench": "learner", "median_tokens_per_s": tok, "ratios": ratios}), flush=True)
    append_result("learner", {"median_tokens_per_s": tok, "ratios": ratios, "sides": rows}, info=first["machine"])
    lo, hi = first["completion_len"]
    cells = "; ".join(f"{side} {show_spread(row['tokens_per_s'], ' tok/s')}" for side, row in rows.items())
    shown = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
    pack = f", pack sides: {args.jobs} jobs of their own samples" if any(s in rows for s in PACK_SIDES) else ""
    print(
        f"| learner step: {first['model']} {args.backend} {args.dtype}, {args.groups * args.group_size} samples{pack} "
        f"({args.groups} prompts x "
        f"{args.group_size}, {args.prompt_len}-token prompts, completions {lo}-{hi}), LoRA r={args.rank}, "
        f"micro-batch {args.micro_batch_size} seqs / {args.micro_batch_tokens} tokens packed | {cells} | "
        f"**{shown or 'one side: no ratio'}** | {machine_label(first['machine'])} |"
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=57)
    ap.add_argument("--completion-len", default="10:40", help="lo:hi completion tokens, uniform")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    backends = ["peft", "unsloth"]  # PEFT in --dtype, or the GPU demo's Unsloth 4-bit (CUDA; no raw side)
    ap.add_argument("--backend", default="peft", choices=backends, help="our sides' learner")
    ap.add_argument("--micro-batch-size", type=int, default=16, help="padded sides: sequences per micro-batch")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096, help="packed sides: tokens per row")
    ap.add_argument("--packed-attention", default="auto", choices=["auto", "sdpa", "varlen"])
    ap.add_argument("--jobs", type=int, default=4, help="pack sides: jobs (adapters) stepped per timed step")
    ap.add_argument(
        "--pack-micro-batches", type=int, default=1, help="grouped side: each job's micro-batches a forward"
    )
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per side (after one warm-up)")
    ap.add_argument("--sides", default="raw,ours_full,ours_shared,ours_packed,ours_packed_shared")
    ap.add_argument("--kl", type=float, default=0.0, help="our sides' KL coefficient (>0 adds the reference forward)")
    ap.add_argument("--probe-entropy", action="store_true", help="also time ours_full without the entropy metric")
    ap.add_argument("--profile", type=int, default=0, help="also profile one step per side: the top N ops by self time")
    ap.add_argument(
        "--ops", action="store_true", help="also count the torch ops one step dispatches (CPU: all of them)"
    )
    ap.add_argument("--side", choices=SIDES, default=None, help="run one side in this process")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.side is None:
        if args.probe_entropy and "ours_full_no_entropy" not in args.sides:
            args.sides += ",ours_full_no_entropy"
        return compare(args)
    print(json.dumps(run_side(args)), flush=True)


if __name__ == "__main__":
    main()
