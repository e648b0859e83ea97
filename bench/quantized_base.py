"""Which base should a 4-bit learner's vLLM actors serve? Each `model.actor_base` side by side, on one CUDA GPU:

    python -m bench.quantized_base [--model PATH | --shape qwen2.5-0.5b] [--kind unsloth|peft] \
        [--sides learner,quantized,original]

- learner:   the learner's NF4 base dequantized to bf16 (rl/learner/quantized_base.py), served by bf16 kernels;
- quantized: vLLM quantizes model.path to NF4 itself (bitsandbytes' kernels, the adapter through vLLM's LoRA);
- original:  model.path's own weights beside the 4-bit learner (the pairing the first two replace).

Per side, in a fresh process (Unsloth patches torch on import and an in-process engine is not torn down cleanly):
the mean |logp difference| per token between the actor and the learner on the actor's own samples before any
training (16 prompts x 4 samples x 64 tokens at temperature 1: what the sync probe's floor estimates from fewer
tokens), the actor's weight memory (its parameters and bitsandbytes' quantization state), the learner's memory after
loading, the rollout rate with the learner's adapter loaded as a run loads it (64 prompts x 8 samples x 128 tokens
by default, median and spread of 3 calls after a warm-up), and for `quantized` whether vLLM's NF4 codes equal the
learner's (every quantized projection dequantized on both sides and compared). Prints one JSON line per side
(`--sides quantized` for one) and a table. A random shape's folder is built once in the cache
(`python -m bench.shapes qwen2.5-7b <cache>/bench/qwen2.5-7b --device cuda` builds the 7B one faster on the GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

from bench.common import REPO, add_model_args, append_result, model_path, show_spread, spread
from tests.helpers import repo_env

SIDES = ("learner", "quantized", "original")
KINDS = {"unsloth": "model.learner_backend=unsloth", "peft": "model.learner_backend=peft"}
# vLLM fuses these projections into one parameter, each HF projection a shard of it in this order
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def config(path: str, kind: str, side: str, memory: float):
    from rl.resolve import from_overrides

    return from_overrides(
        path,
        "cluster.use_gpu=true",
        "model.load_in_4bit=true",
        KINDS[kind],
        f"model.actor_base={side}",
        f"cluster.gpu_memory_utilization={memory}",
        "model.max_new_tokens=128",
        "algorithm.kl_coef=0",
        run_dir="/tmp/rlft-bench-quantized-base",
    )


def actor_weight_bytes(worker) -> int:
    """The engine's weights as it holds them: parameters, plus bitsandbytes' quantization state (absmax and its
    nested quantization) hung on NF4 parameters."""
    total = 0
    for p in worker.model_runner.model.parameters():
        total += p.numel() * p.element_size()
        for qs in (getattr(p, "bnb_quant_state", None) or {}).values():
            for t in (qs.absmax, qs.code, *((qs.state2.absmax, qs.state2.code) if qs.nested else ())):
                total += t.numel() * t.element_size()
    return total


def engine_dequantized(worker) -> dict[str, object]:
    """{HF weight name: dequantized tensor (CPU)} for every NF4 parameter of a vLLM engine, its fused shards split
    back into the HF projections."""
    from bitsandbytes.functional import dequantize_4bit

    out = {}
    for name, p in worker.model_runner.model.named_parameters():
        states = getattr(p, "bnb_quant_state", None)
        if not states:
            continue
        offsets = p.bnb_shard_offsets
        prefix, _, leaf = name.removesuffix(".weight").replace(".base_layer", "").rpartition(".")
        parts = FUSED.get(leaf, (leaf,))
        for i in range(len(states)):
            w = dequantize_4bit(p.data[offsets[i] : offsets[i + 1]], states[i])
            out[f"{prefix}.{parts[i]}"] = w.cpu()
    return out


def same_codes(engine: dict, learner: dict) -> dict:
    """How far vLLM's dequantized NF4 weights are from the learner's, projection by projection."""
    common = sorted(set(engine) & set(learner))
    exact = sum(bool((engine[n] == learner[n].to(engine[n].dtype)).all()) for n in common)
    worst = max((float((engine[n].float() - learner[n].float()).abs().max()) for n in common), default=float("nan"))
    return {
        "projections_compared": len(common),
        "projections_equal": exact,
        "max_abs_diff": worst,
        "engine_only": len(set(engine) - set(learner)),
        "learner_only": len(set(learner) - set(engine)),
    }


def make_actor_base(cfg) -> float:
    """Seconds to make the base the actors load: what rl/app.py does before the roles start (cached after the first
    time; nothing to make when the actors load model.path)."""
    from rl.learner.quantized_base import dequantized_base

    t0 = time.perf_counter()
    if cfg.model.actor_path != cfg.model.path:
        dequantized_base(cfg.model, max_seq_length=cfg.max_seq_length, seed=cfg.run.seed)
    return time.perf_counter() - t0


def sampled_mismatch(actor, lrn, prompts: list[list[int]]) -> tuple[float, int]:
    """(mean |logp difference| per token, tokens) between `actor` and `lrn` on the actor's own samples before any
    training: 4 seeded samples of up to 64 tokens per prompt at temperature 1, which the learner scores (what the
    sync probe's floor estimates from fewer tokens)."""
    from rl.types import Sampling

    rollouts = actor.generate(prompts, Sampling(n=4, temperature=1.0, max_tokens=64), seeds=list(range(len(prompts))))
    completions = [c for r in rollouts for c in r.completions]
    scored = lrn.sequence_logprobs(
        [r.prompt_ids for r in rollouts for _ in r.completions], [c.token_ids for c in completions]
    )
    diffs = [abs(a - b) for c, lp in zip(completions, scored) for a, b in zip(c.logprobs, lp)]
    return sum(diffs) / len(diffs), len(diffs)


def nf4_codes(actor, lrn) -> dict:
    """`same_codes` of a vLLM engine that quantized model.path itself and the 4-bit learner beside it."""
    from rl.learner.quantized_base import dequantized_weights

    return same_codes(actor.llm.collective_rpc(engine_dequantized)[0], dequantized_weights(lrn.model))


def run_side(args) -> dict:
    import torch
    from transformers import AutoTokenizer

    from bench.common import demo_prompts, timed_generations
    from rl.app import learner_args, rollout_args
    from rl.learner import Learner
    from rl.rollout.vllm import VLLMRollout
    from rl.types import Sampling

    path = model_path(args)
    cfg = config(path, args.kind, args.side, args.memory)
    made_s = make_actor_base(cfg)
    actor = VLLMRollout(**rollout_args(cfg))
    actor_bytes = actor.llm.collective_rpc(actor_weight_bytes)[0]
    before = torch.cuda.memory_allocated()
    lrn = Learner(**learner_args(cfg))
    learner_bytes = torch.cuda.memory_allocated() - before
    tok = AutoTokenizer.from_pretrained(path)
    mismatch, tokens = sampled_mismatch(actor, lrn, demo_prompts(tok, 16))
    out = {
        "side": args.side,
        "kind": args.kind,
        "model": args.shape or args.model,
        "mismatch": mismatch,
        "mismatch_tokens": tokens,
        "actor_weights_gib": actor_bytes / 2**30,
        "learner_gib": learner_bytes / 2**30,
        "base_made_s": made_s,
        "rollout_prompts": args.rollout_prompts,
    }
    if args.side == "quantized":
        out["codes"] = nf4_codes(actor, lrn)
    adapter = dataclasses.replace(lrn.get_adapter(for_sync=True), version=1)  # a run's first sync (LoRA ids are > 0)
    actor.load_adapter(adapter)  # as in training: merged (learner) or vLLM's LoRA (quantized)
    sampling = Sampling(n=8, temperature=1.0, max_tokens=128)
    prompts = demo_prompts(tok, args.rollout_prompts, seed=1)
    rates, tokens = timed_generations(lambda p, s: actor.generate(p, s), prompts, sampling, 3)
    out["rollout_tok_s"] = spread(rates)
    out["rollout_tokens"] = tokens
    actor.close()
    return out


def without_sides(argv: list[str]) -> list[str]:
    """The command line less `--sides X` / `--sides=X` (each side's process gets `--side` instead)."""
    out, skip = [], False
    for a in argv:
        if not skip and not a.startswith("--sides"):
            out.append(a)
        skip = a == "--sides"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--kind", default="unsloth", choices=sorted(KINDS))
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)  # one side, in this process
    ap.add_argument("--memory", type=float, default=0.35, help="cluster.gpu_memory_utilization of the actor")
    ap.add_argument("--rollout-prompts", type=int, default=64, help="prompts of each timed rollout call (x 8 samples)")
    args = ap.parse_args()
    if args.side:
        print(json.dumps(run_side(args)), flush=True)
        return
    rows = []
    for side in args.sides.split(","):
        argv = without_sides(sys.argv[1:])
        env = repo_env(**({"RLFT_IMPORT_UNSLOTH": "1"} if args.kind == "unsloth" else {}))
        proc = subprocess.run(
            [sys.executable, "-m", "bench.quantized_base", *argv, "--side", side],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        if proc.returncode != 0 or not lines:
            print(f"side {side} failed:\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
            continue
        rows.append(json.loads(lines[-1]))
        print(lines[-1], flush=True)
    print(f"\n{args.shape or args.model}, {args.kind} 4-bit learner ({os.environ.get('RLFT_MACHINE', 'this GPU')}):")
    print("| actor_base | mismatch (nats/token) | actor weights | learner | rollout tok/s | NF4 codes equal |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        codes = r.get("codes")
        same = f"{codes['projections_equal']}/{codes['projections_compared']}" if codes else "-"
        print(
            f"| {r['side']} | {r['mismatch']:.4f} ({r['mismatch_tokens']} tokens) | {r['actor_weights_gib']:.2f} GiB "
            f"| {r['learner_gib']:.2f} GiB | {show_spread(r['rollout_tok_s'])} | {same} |"
        )
    if rows:
        append_result("quantized_base", {"sides": rows})


if __name__ == "__main__":  # vLLM may spawn processes
    main()
