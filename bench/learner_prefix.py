"""Learner step time with and without prompt-prefix sharing, on the same samples, in one process.

python -m bench.learner_prefix [--model embedded:smollm2-135m-instruct] [--groups 8] [--group-size 8]
    [--prompt-len 57] [--completion-len 10:40] [--dtype bfloat16] [--repeats 2]

Prints one JSON line per setting and a markdown row with the ratio. Token ids are random (speed does not
depend on them); lengths default to the demo's (57-token prompts, 10-40-token completions, 8 x 8 samples).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=57)
    ap.add_argument("--completion-len", default="10:40")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    from rl.learner import PeftLearner
    from rl.models import resolve_model_path
    from rl.types import TrainSample

    path = resolve_model_path(args.model)
    lo, hi = (int(x) for x in args.completion_len.split(":"))
    rng = random.Random(0)
    samples = []
    for _ in range(args.groups):
        prompt = [rng.randrange(100, 40000) for _ in range(args.prompt_len)]
        for _ in range(args.group_size):
            n = rng.randrange(lo, hi + 1)
            samples.append(
                TrainSample(prompt, [rng.randrange(100, 40000) for _ in range(n)], [-1.0] * n, rng.gauss(0, 1))
            )
    results = {}
    for share in (False, True):
        learner = PeftLearner(
            path,
            dtype=args.dtype,
            micro_batch_size=args.micro_batch_size,
            share_prompt_prefix=share,
            lora_targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
        learner.train_step(samples)  # warm-up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            learner.train_step(samples)
            times.append(time.perf_counter() - t0)
        results[share] = statistics.median(times)
        print(
            json.dumps(
                {
                    "bench": "learner_prefix",
                    "share_prompt_prefix": share,
                    "step_s": round(results[share], 2),
                    "samples": len(samples),
                    "dtype": args.dtype,
                }
            ),
            flush=True,
        )
        del learner
    ratio = results[False] / results[True]
    print(
        f"| learner step, {len(samples)} samples ({args.groups} prompts x {args.group_size}), {args.dtype} "
        f"| full forward {results[False]:.1f} s | shared prefix {results[True]:.1f} s | {ratio:.2f}x |"
    )


if __name__ == "__main__":
    main()
