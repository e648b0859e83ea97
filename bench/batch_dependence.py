"""Do a vLLM engine's seeded samples depend on which requests share its batch? `python -m bench.batch_dependence`

The same 8 demo-like prompts (bench/common.py `demo_prompts`: chain_sum's two 1-digit terms; SmolLM2-135M-Instruct
by default, bf16, 8 samples each at temperature 1, every prompt's request with its own seed, as a run sends them)
go through one engine four ways: all 8 in one `generate`,
the same again, two calls of 4, and one call per prompt. It prints how many of the 64 samples differ from the first
call's. Seeds fix the random draws; a count above 0 for another split means the logits depend on the batch
(docs/configuration.md, "Reproducible runs"). Set VLLM_ENABLE_V1_MULTIPROCESSING=0 to run the engine core in this
process, as the framework's CPU actors do.
"""

from __future__ import annotations

import argparse
import os
import time

from bench.common import add_model_args, append_result, demo_prompts, model_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    path = model_path(args)
    prompts = demo_prompts(AutoTokenizer.from_pretrained(path), 8)
    llm = LLM(
        model=path,
        dtype=args.dtype,
        max_model_len=288,
        seed=0,
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        logprobs_mode="processed_logprobs",
        enable_chunked_prefill=False,  # as rl/rollout/vllm.py on CPU
    )

    def generate(idx: list[int]) -> dict[int, list[tuple[int, ...]]]:
        params = [
            SamplingParams(n=8, temperature=1.0, max_tokens=args.max_tokens, seed=1000 + i, logprobs=0) for i in idx
        ]
        outs = llm.generate([{"prompt_token_ids": prompts[i]} for i in idx], params, use_tqdm=False)
        return {i: [tuple(c.token_ids) for c in o.outputs] for i, o in zip(idx, outs)}

    def differ(a: dict, b: dict) -> int:
        return sum(x != y for i in a for x, y in zip(a[i], b[i]))

    t0 = time.perf_counter()
    first = generate(list(range(8)))
    again = generate(list(range(8)))
    halves = generate(list(range(4))) | generate(list(range(4, 8)))
    single = {i: generate([i])[i] for i in range(8)}
    mp = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    differing = {"same_call": differ(first, again), "two_calls_of_4": differ(first, halves)}
    differing["one_call_per_prompt"] = differ(first, single)
    print(
        f"{path} {args.dtype}, VLLM_ENABLE_V1_MULTIPROCESSING={mp}: samples of 64 that differ from one call of 8: "
        f"the same call again {differing['same_call']}, two calls of 4 {differing['two_calls_of_4']}, one call per "
        f"prompt {differing['one_call_per_prompt']} ({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    append_result("batch_dependence", {"engine_core_multiprocessing": mp, "samples_differing_of_64": differing})


if __name__ == "__main__":  # vLLM spawns processes: keep this guard
    main()
