"""Rollout throughput of the vLLM actor: base model, native LoRA (LoRARequest) and merged LoRA, same prompts.

python -m bench.rollout_lora_mode [--model embedded:smollm2-135m-instruct] [--prompts 16] [--n 8]
    [--max-tokens 48] [--repeats 2]

Each mode starts its own engine (one at a time; this machine has 2 cores). Prints JSON lines and a markdown row
with tokens/s and the adapter load time. The adapter has random non-zero weights (rank 16, all 7 projections).
"""

from __future__ import annotations

import argparse
import json
import os

from bench.common import append_result, random_adapters, timed_generations


def run_mode(mode: str, path: str, prompts: list[list[int]], adapter, args) -> dict:
    from rl.app import rollout_args
    from rl.resolve import from_overrides
    from rl.rollout.vllm import VLLMRollout
    from rl.types import Sampling

    lora_mode = "native" if mode == "base" else mode
    keys = [f"cluster.lora_mode={lora_mode}", "model.max_prompt_tokens=448", "model.max_new_tokens=64"]
    r = VLLMRollout(**rollout_args(from_overrides(path, *keys)))
    load_s = r.load_adapter(adapter)["seconds"] if mode != "base" else 0.0
    sampling = Sampling(n=args.n, temperature=1.0, max_tokens=args.max_tokens)
    rates, _ = timed_generations(r.generate, prompts, sampling, args.repeats)
    r.close()
    return {
        "bench": "rollout_lora_mode",
        "mode": mode,
        "tokens_per_s": round(max(rates)),
        "adapter_load_s": round(load_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from rl.model_path import resolve_model_path
    from rl.rollout.vllm import cpu_threads_env

    os.environ.update(cpu_threads_env(None))
    path = resolve_model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is {i} + {i + 3}?"}], add_generation_prompt=True, tokenize=True
        )["input_ids"]
        for i in range(args.prompts)
    ]
    adapter = random_adapters(path, threads=1)[0]
    rows = {}
    for mode in ("base", "native", "merged"):
        rows[mode] = run_mode(mode, path, prompts, adapter, args)
        print(json.dumps(rows[mode]), flush=True)
    b, n, m = (rows[k]["tokens_per_s"] for k in ("base", "native", "merged"))
    print(
        f"| vLLM CPU rollout, {args.prompts} prompts x {args.n}, {args.max_tokens} new tokens | base {b} tok/s "
        f"| LoRA native {n} tok/s | LoRA merged {m} tok/s | merged/native {m / n:.2f}x | "
        f"load native {rows['native']['adapter_load_s']} s, merged {rows['merged']['adapter_load_s']} s |"
    )
    append_result("rollout_lora_mode", {"modes": rows, "merged_over_native": round(m / n, 2)})


if __name__ == "__main__":
    main()
