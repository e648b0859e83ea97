"""Learner tokens/s inside the framework against the raw library step, on the same shapes, in one process.

python -m bench.learner_backends --backend unsloth --shape qwen2.5-0.5b --batch 8 --seq 1024 [--rounds 2]
    --backend: unsloth (4-bit + LoRA, gradient checkpointing "unsloth") | peft-bnb (PEFT LoRA on a bitsandbytes
    NF4 base) | peft (PEFT LoRA on a bf16 base); CUDA for the first two; `peft` also runs on CPU (use --shape tiny).

raw: the library as its own docs use it: the model + LoRA (r 16, all 7 projections), a batch of random token ids
of length --seq with labels = input ids, forward with the library's loss, backward, AdamW step.
ours: rl.learner.Learner with the same backend, rank, targets, dtype and optimizer; `train_step` on --batch
TrainSamples of --seq tokens (half prompt, half completion, every prompt distinct so nothing is shared), as the
driver calls it. `--micro-batches K`: K micro-batches of --batch per optimizer step on both sides (raw accumulates
K forward/backward passes; ours takes K x --batch samples in micro-batches of --batch), as a run's step does (the
e2e runs take 8): what is paid once per optimizer step (the step's one host sync, gradient clipping, the metrics'
transfer) is then shared by K micro-batches. Tokens/s counts every position of the forward (K x batch x seq) for
both; steady state over --steps steps after --warmup. Prints one JSON line per side and a markdown row with the
ratio ours / raw. `--profile N`: one more step per side under torch's profiler, its top N ops and the CPU / CUDA
totals (where ours spends what raw does not). `--split-step`: the ours process also times two steps between the
two sides, on our learner's own model: the library's step (its loss with labels, AdamW, no metrics) and our logits
path with a plain mean loss and no host sync; these tell a difference of model build from one of step code.

Models come from bench/shapes.py (random-init Qwen2.5 shapes, 32k vocabulary: speed does not depend on the
weights). Each side runs in its own fresh process (`--rounds` times, alternating raw / ours; the table reports each
side's median): Unsloth patches and compiles per process, and with two Unsloth models in one process the timings
depend on which was built and run first (H200, 0.5B: ours/raw 0.86x in one process, raw first, against 1.13x in
fresh processes). A framework learner is always alone in its process. `--side raw|ours` runs one side here.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time

from bench.common import LORA_TARGETS as TARGETS
from bench.common import append_result, peak_gib, profiled_step, run_side_process


def timed_steps(step, steps: int, warmup: int, cuda: bool) -> float:
    """Median-free mean seconds per step over `steps` after `warmup` (synchronised on CUDA)."""
    import torch

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def build_raw(args, path: str):
    """The library's own LoRA model and an AdamW step with its built-in causal-LM loss (it reports no metrics)."""
    import torch

    if args.backend == "unsloth":
        from unsloth import FastLanguageModel

        model, _ = FastLanguageModel.from_pretrained(
            model_name=path, max_seq_length=args.seq, dtype=torch.bfloat16, load_in_4bit=True
        )
        model = FastLanguageModel.get_peft_model(
            model,
            r=args.rank,
            lora_alpha=2 * args.rank,
            lora_dropout=0.0,
            target_modules=TARGETS,
            bias="none",
            use_gradient_checkpointing="unsloth",
            random_state=0,
        )
    else:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        kwargs: dict = {"dtype": torch.bfloat16 if args.device == "cuda" else torch.float32}
        if args.backend == "peft-bnb":
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.bfloat16,
                bnb_4bit_use_double_quant=True,
            )
            kwargs["device_map"] = {"": args.device}
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if args.backend != "peft-bnb":
            model = model.to(args.device)
        model = get_peft_model(
            model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=TARGETS, task_type="CAUSAL_LM")
        )
    model.train()
    return model, library_step(model, args), [], {}


def library_step(model, args):
    """The library's own step on --micro-batches batches of random ids: its causal-LM loss with labels (Unsloth's
    fused cross-entropy), gradients accumulated, one AdamW step, no metrics and no host sync."""
    import torch

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    gen = torch.Generator().manual_seed(0)
    shape = (args.micro_batches, args.batch, args.seq)
    batches = torch.randint(3, args.vocab - 1, shape, generator=gen).to(args.device)

    def step():
        opt.zero_grad(set_to_none=True)
        for ids in batches:
            loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
            (loss / args.micro_batches).backward()
        opt.step()

    return step


def build_ours(args, path: str):
    """rl.learner.Learner as a run builds it, stepping on TrainSamples of the same shapes; each step's metrics are
    kept in the returned list, and `--split-step`'s rates are the returned extra fields."""
    from bench.common import learner_config
    from rl.app import learner_args
    from rl.learner import Learner
    from rl.types import TrainSample

    backend = {"unsloth": "unsloth", "peft-bnb": "peft", "peft": "peft"}[args.backend]
    cfg = learner_config(
        path,
        f"model.learner_backend={backend}",
        f"model.load_in_4bit={args.backend in ('unsloth', 'peft-bnb')}",
        f"model.lora_targets=[{','.join(TARGETS)}]",
        "algorithm.lr=1e-5",
        f"learner.micro_batch_size={args.batch}",
        "learner.share_prompt_prefix=false",
        f"model.max_prompt_tokens={args.seq // 2}",
        f"model.max_new_tokens={args.seq - args.seq // 2}",
        f"cluster.use_gpu={args.device == 'cuda'}",
        rank=args.rank,
        dtype="bfloat16" if args.device == "cuda" else "float32",
    )
    learner = Learner(**learner_args(cfg))
    rng = random.Random(0)
    half = args.seq // 2
    samples = [
        TrainSample(
            [rng.randrange(3, args.vocab - 1) for _ in range(half)],
            [rng.randrange(3, args.vocab - 1) for _ in range(args.seq - half)],
            [-10.0] * (args.seq - half),
            rng.choice([-1.0, 1.0]),
        )
        for _ in range(args.batch * args.micro_batches)
    ]
    metrics: list[dict] = []  # every step's, for the learner's per-step peak memory (bench.common.peak_gib)
    extra = {"split_step": split_step(learner, samples, args)} if args.split_step else {}
    return learner, lambda: metrics.append(learner.train_step(samples)), metrics, extra


def split_step(learner, samples, args) -> dict:
    """`--split-step`: tokens/s of two steps on our learner's model (see the module's docstring), timed before
    ours; they share its process, so they compare with each other and with ours, not with raw's process."""
    import torch

    cuda = args.device == "cuda"
    ours_setting = os.environ.pop("UNSLOTH_RETURN_LOGITS", None)  # unset: the library's fused loss, as raw runs it
    out = {"library_step_on_our_model": timed_steps(library_step(learner.model, args), args.steps, args.warmup, cuda)}
    if ours_setting is not None:
        os.environ["UNSLOTH_RETURN_LOGITS"] = ours_setting
    opt = torch.optim.AdamW([p for p in learner.model.parameters() if p.requires_grad], lr=1e-5)
    micro = learner.batcher.micro_batches(samples)
    masks = [learner.batcher.completion_batch(mb)[0] for mb in micro]

    def our_logits_plain_loss():
        opt.zero_grad(set_to_none=True)
        for mb, mask in zip(micro, masks):
            logp = learner.batcher.logprobs(learner.model, mb)[0]
            (-(logp * mask).sum() / mask.sum() / len(micro)).backward()
        opt.step()

    out["our_logits_plain_loss_no_sync"] = timed_steps(our_logits_plain_loss, args.steps, args.warmup, cuda)
    tokens = args.micro_batches * args.batch * args.seq
    return {name: round(tokens / sec, 1) for name, sec in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["unsloth", "peft-bnb", "peft"], default="unsloth")
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers of the shape (default: all)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=1, help="micro-batches of --batch per optimizer step")
    ap.add_argument(
        "--split-step", action="store_true", help="ours: also time the library's and a plain step on our model"
    )
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per side (alternating raw / ours)")
    ap.add_argument("--side", choices=["raw", "ours", "both"], default="both", help="one side in this process")
    ap.add_argument("--profile", type=int, default=0, help="also profile one step per side: the top N ops by self time")
    ap.add_argument("--models", default=os.path.expanduser("~/.cache/rlft/shapes"))
    args = ap.parse_args()
    if args.side == "both":
        return compare(args)
    if args.backend == "unsloth":
        # raw keeps Unsloth's default fused loss (no logits); ours sets UNSLOTH_RETURN_LOGITS=1 when it is built
        import unsloth  # noqa: F401  (first ML import of this process)
    import torch

    cuda = torch.cuda.is_available()
    args.device = "cuda" if cuda else "cpu"
    if args.backend != "peft" and not cuda:
        raise SystemExit(f"--backend {args.backend} needs CUDA")
    name, path = model_folder(args)
    obj, step, step_metrics, extra = (build_raw if args.side == "raw" else build_ours)(args, path)
    sec = timed_steps(step, args.steps, args.warmup, cuda)
    result = {
        "side": args.side,
        "backend": args.backend,
        "shape": name,
        "batch": args.batch,
        "seq": args.seq,
        "seconds_per_step": round(sec, 4),
        "micro_batches": args.micro_batches,
        "tokens_per_s": round(args.micro_batches * args.batch * args.seq / sec, 1),
        "peak_gib": round(peak_gib(step_metrics), 2),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        **extra,
    }
    if args.profile:
        result["profile"] = profiled_step(step, args.profile)
    print(json.dumps(result), flush=True)
    del obj, step, step_metrics
    gc.collect()


def model_folder(args) -> tuple[str, str]:
    from bench.shapes import build_model_folder

    name = f"{args.shape}-v{args.vocab}" + (f"-l{args.layers}" if args.layers else "")
    path = build_model_folder(
        args.shape, f"{args.models}/{name}", vocab_size=args.vocab, layers=args.layers, device=args.device
    )
    return name, str(path)


def compare(args) -> None:
    """Run each side `--rounds` times in a fresh process, alternating, and print the medians and their ratio."""
    runs: dict[str, list[dict]] = {"raw": [], "ours": []}
    for _ in range(args.rounds):
        for side in ("raw", "ours"):
            row = run_side_process("bench.learner_backends", side, sys.argv[1:], flag="--side")
            table = row.pop("profile", None)
            runs[side].append(row)
            print(json.dumps(row), flush=True)
            if table:
                print(f"profile of one {side} step:\n{table}", flush=True)
    med = {side: statistics.median(r["tokens_per_s"] for r in rs) for side, rs in runs.items()}
    peak = {side: max(r["peak_gib"] for r in rs) for side, rs in runs.items()}
    first = runs["raw"][0]
    ratio = round(med["ours"] / med["raw"], 3)
    print(json.dumps({"median_tokens_per_s": med, "ratio_ours_over_raw": ratio}))
    append_result(
        "learner_backends", {"median_tokens_per_s": med, "ratio_ours_over_raw": ratio, "peak_gib": peak, "runs": runs}
    )
    print(
        f"| learner {args.backend} | {first['device']} | {first['shape']}, {args.micro_batches} x batch {args.batch} x "
        f"seq {args.seq}, "
        f"LoRA r{args.rank} | raw {med['raw']:.0f} tok/s ({peak['raw']} GiB) | "
        f"ours {med['ours']:.0f} tok/s ({peak['ours']} GiB) | **{med['ours'] / med['raw']:.2f}x** | "
        f"{time.strftime('%Y-%m-%d')} |"
    )


if __name__ == "__main__":
    main()
