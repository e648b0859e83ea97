"""Where the Unsloth learner step's time goes, ours vs raw (diagnostics for bench/learner_backends.py, GPU only).

python bench/gpu/profile_learner.py MODEL_DIR [--batch 8] [--seq 1024] [--steps 10] [--profile]

Times, in one process, interleaved after warm-up, wall and CPU seconds per step of:
  raw        Unsloth's own step (labels -> its fused loss) on its own model
  ours       rl.learner.Learner.train_step (as a run calls it)
  bare       ours' model, our forward (logits_to_keep over the completion half) + token logprobs + a plain
             policy-gradient loss, no metrics: what the framework adds on top of this is bookkeeping
  raw@ours   the raw step on ours' model (is the model itself built differently?)
CPU seconds close to wall seconds mean the step is launch-bound (the GPU waits for Python).
--profile also prints the torch profiler table (CPU and CUDA time by op) of raw and ours.
"""
# ruff: noqa: I001  (unsloth must be imported before torch)

import argparse
import json
import os
import time

import unsloth  # noqa: F401

import torch

from bench.learner_backends import build_ours, build_raw


def timed(step, steps: int) -> tuple[float, float]:
    torch.cuda.synchronize()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()

    class A:
        backend, device, rank, vocab = "unsloth", "cuda", 16, 32000
        batch, seq = a.batch, a.seq

    raw_model, raw_step = build_raw(A, a.model)
    learner, ours_step = build_ours(A, a.model)  # sets UNSLOTH_RETURN_LOGITS=1 for its own forwards
    model = learner.model
    opt = learner.optimizer
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, A.vocab - 1, (a.batch, a.seq), generator=gen).cuda()
    attn = torch.ones_like(ids)
    half = a.seq // 2
    adv = torch.randn(a.batch, 1, device="cuda")
    from rl.learner import token_logprobs

    def bare():
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=a.seq - half + 1).logits[:, :-1]
        logp = token_logprobs(logits, ids[:, half:])
        (-(logp * adv).mean()).backward()
        opt.step()

    def raw_on_ours():
        os.environ["UNSLOTH_RETURN_LOGITS"] = "0"
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=attn, labels=ids).loss.backward()
        opt.step()
        os.environ["UNSLOTH_RETURN_LOGITS"] = "1"

    def raw():
        os.environ["UNSLOTH_RETURN_LOGITS"] = "0"
        raw_step()
        os.environ["UNSLOTH_RETURN_LOGITS"] = "1"

    variants = {"raw": raw, "ours": ours_step, "bare": bare, "raw@ours": raw_on_ours}
    for step in variants.values():  # warm-up (compilation, autotuning)
        for _ in range(3):
            step()
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for _ in range(2):  # interleaved rounds: drift hits every variant alike
        for name, step in variants.items():
            results[name].append(timed(step, a.steps))
    for name, rows in results.items():
        wall = min(w for w, _ in rows)
        cpu = min(c for _, c in rows)
        print(
            json.dumps(
                {
                    "variant": name,
                    "wall_s": round(wall, 4),
                    "cpu_s": round(cpu, 4),
                    "tokens_per_s": round(a.batch * a.seq / wall, 1),
                }
            ),
            flush=True,
        )
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        for name in ("raw", "ours"):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(2):
                    variants[name]()
                torch.cuda.synchronize()
            print("=====", name)
            print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
