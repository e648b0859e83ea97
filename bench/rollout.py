"""Rollout throughput: our vLLM actor (rl.rollout.VLLMRollout, as the framework uses it) against HF `generate` on
the same model, prompts, sampling and lengths, in one process run (both sides under the same machine load).

CPU (about 3 min here):  python -m bench.rollout
CUDA (random Qwen2.5-0.5B shape, no hub needed):  python -m bench.rollout --device cuda --shape qwen2.5-0.5b \
    --prompts 64 --n 8 --max-tokens 256

Ours: one `generate` call with the whole step's prompts (the driver passes all prompts of a step at once; vLLM
batches them continuously), with a rank-16 adapter loaded the way the framework loads it (lora_mode auto:
merged on CPU, native LoRARequest on CUDA). HF: `model.generate` on all prompts x n in one left-padded batch
(the strongest plain-HF setting; rows that finish early still ride along until the longest finishes), on the
base weights (what a merged adapter costs). Same temperature 1 sampling, top_p 1, no top-k, max_tokens.
Tokens/s counts generated tokens up to and including EOS on both sides. Prints JSON lines and a markdown row.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from bench.common import (
    add_model_args,
    demo_prompts,
    machine,
    machine_label,
    median,
    model_path,
    random_adapter,
    set_threads,
    timed_generations,
)


def hf_generate_rate(path: str, prompts: list[list[int]], args) -> dict:
    """Generated tokens/s of plain transformers `generate`, all prompts x n in one batch."""
    import torch
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    set_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(device).eval()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    pad = 0
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as decoder-only generate wants
        ids[i, L - len(p) :] = torch.tensor(p)
        attn[i, L - len(p) :] = 1

    def run(k: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids[:k].to(device),
                attention_mask=attn[:k].to(device),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=None,
                max_new_tokens=args.max_tokens,
                num_return_sequences=args.n,
                pad_token_id=pad,
            )
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        tokens = 0
        for row in out[:, L:].tolist():
            tokens += next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        return tokens, dt

    run(min(2, len(prompts)))  # warm-up
    rates, toks = [], []
    for _ in range(args.repeats):
        n_tok, dt = run(len(prompts))
        rates.append(n_tok / dt)
        toks.append(n_tok)
    return {"side": "hf_generate", "tokens_per_s": round(median(rates), 1), "tokens": toks, "rates": rates}


def vllm_rate(path: str, prompts: list[list[int]], adapter, args) -> dict:
    """Generated tokens/s of our actor: one generate call with every prompt of the step."""
    from rl.rollout import VLLMRollout
    from rl.types import Sampling

    lora_mode = "native" if args.device == "cuda" else "merged"  # what cluster.lora_mode=auto picks
    t0 = time.perf_counter()
    r = VLLMRollout(
        path,
        lora_mode=lora_mode,
        dtype=args.dtype,
        max_model_len=max(len(p) for p in prompts) + args.max_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.device == "cpu",
    )
    start_s = time.perf_counter() - t0
    load_s = r.load_adapter(adapter)["seconds"]
    sampling = Sampling(n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens)
    rates, toks = timed_generations(r.generate, prompts, sampling, args.repeats)
    r.close()
    return {
        "side": f"ours_vllm_{lora_mode}",
        "tokens_per_s": round(median(rates), 1),
        "tokens": toks,
        "rates": rates,
        "engine_start_s": round(start_s, 1),
        "adapter_load_s": round(load_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (demo: 8)")
    ap.add_argument("--n", type=int, default=8, help="completions per prompt (demo: group_size 8)")
    ap.add_argument("--max-tokens", type=int, default=32, help="max new tokens (demo: 32)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    args = ap.parse_args()

    if args.device == "cuda":
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # vLLM 0.26 on the GPU machine (FACTS.md)
    else:
        from rl.rollout import cpu_threads_env

        os.environ.update(cpu_threads_env(args.threads))
    from transformers import AutoTokenizer

    path = model_path(args)
    prompts = demo_prompts(AutoTokenizer.from_pretrained(path), args.prompts)
    adapter = random_adapter(path, 16, threads=args.threads)
    before = machine()
    hf = hf_generate_rate(path, prompts, args)
    ours = vllm_rate(path, prompts, adapter, args)
    info = machine()
    info["load_avg_before"] = before["load_avg"]
    work = {
        "model": args.shape or args.model,
        "prompts": args.prompts,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "prompt_len_mean": round(sum(map(len, prompts)) / len(prompts), 1),
        "dtype": args.dtype,
        "device": args.device,
        "threads": args.threads,
    }
    ratio = ours["tokens_per_s"] / hf["tokens_per_s"]
    for row in (hf, ours):
        print(json.dumps({"bench": "rollout", **work, **row, "machine": info}), flush=True)
    print(json.dumps({"bench": "rollout", "ratio_ours_over_hf": round(ratio, 2)}))
    print(
        f"| rollout: {work['model']}, {args.prompts} prompts x {args.n}, {args.max_tokens} new tokens, {args.dtype} "
        f"| HF generate {hf['tokens_per_s']:.0f} tok/s | ours (vLLM, {ours['side'].rsplit('_', 1)[1]} LoRA) "
        f"{ours['tokens_per_s']:.0f} tok/s | **{ratio:.2f}x** | {machine_label(info)} |"
    )


if __name__ == "__main__":
    main()
