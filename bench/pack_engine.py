"""A sweep pack's rollout engine on its own: where the pack's rollout time goes, and which engine setting moves it.

python -m bench.pack_engine --device cuda [--jobs 8] [--prompts 32] [--n 16] [--max-tokens 32] [--repeats 3]
    [--sides solo,solo_native,pack,pack_tokens,pack_graphs,pack_unseeded,probe] [--profile N]

The workload is one step of the GPU demo (+experiment=gpu_smollm2_chain_sum: 32 prompts x 16 samples, 32 new tokens,
chain_sum-like prompts, a seed per prompt, the sampled tokens' logprobs), each job with its own random rank-16
adapter. Sides, each in a fresh process (an engine per side):
- `solo`: one job's batch on the engine a solo run builds (the adapter merged into the weights, `cluster.lora_mode`
  auto on a GPU);
- `solo_native`: the same batch through vLLM's LoRA kernels (what a pack's engine runs, at one job's batch);
- `pack`: every job's batch in one engine call, each request through its job's adapter (rl/runtime/packed.py
  PackedRole.generate_jobs, the pack's own path), with the pack's engine limits (rl/rollout/vllm.py pack_batch_limits);
- `pack_tokens`: as `pack` with the step's token budget (`max_num_batched_tokens`) times the jobs;
- `pack_graphs`: as `pack` with CUDA graphs (`cluster.enforce_eager=false`);
- `pack_unseeded`: as `pack` without the per-prompt seeds every other side sends as a run does (vLLM's V1 model
  runner draws each seeded request's noise with its own generator, one request at a time: 4,096 a decode step in a
  pack of 8; its V2 runner, vLLM 0.26's default for this model on a GPU, draws every request's noise in one kernel);
- `probe`: a pack's sync and sync probe on the engine (`probe_side`): each job's next adapter version loaded, the
  jobs' probe calls merged, and the same call again with the adapters resident, which splits the probe's engine time
  into vLLM's loading of the new adapters and the probe's own decoding.
Each side: one full-size warm-up call, then `--repeats` timed calls (`--profile N`: then one more under cProfile, its
top N functions printed, with vLLM's engine core in this process as on the GPU machine
(VLLM_ENABLE_V1_MULTIPROCESSING=0): the scheduler, the model runner and the output handling); the median seconds of a
call and its spread, samples/s, and per side the ratio of its seconds per sample to `solo`'s (1.0: a pack's rollout
costs what the jobs' solo rollouts cost one after another; below: it gains). Prints JSON lines and a markdown table;
appends its result to bench/results.jsonl (claim "pack-engine").
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench.common import (
    append_result,
    demo_prompts,
    median,
    python_profile,
    random_adapters,
    run_side_process,
    show_spread,
    spread,
)

SIDES = ("solo", "solo_native", "pack", "pack_tokens", "pack_graphs", "pack_unseeded", "probe")


def engine_keys(side: str, device: str) -> list[str]:
    """The config overrides of a side's engine (on a GPU the GPU demo's cluster group, as rl/resolve.py resolves it;
    the CPU is for a smoke run)."""
    keys = ["cluster.gpu_memory_utilization=0.2"]
    if device == "cuda":
        keys = ["cluster.use_gpu=true", "cluster.gpus_per_actor=0.5", "cluster.gpu_memory_utilization=0.3"]
    keys.append("cluster.lora_mode=" + ("merged" if side == "solo" else "native"))
    if side == "pack_graphs":
        keys.append("cluster.enforce_eager=false")
    return keys


def run_side(side: str, args) -> dict:
    import time

    import rl.rollout.vllm as engine
    from rl.app import rollout_args
    from rl.model_path import resolve_model_path
    from rl.resolve import from_overrides
    from rl.runtime.packed import PackedRole
    from rl.seeds import prompt_seed
    from rl.types import Sampling

    if args.profile:  # the engine core in this process, so that its work shows in the profile
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    path = resolve_model_path(args.model)
    jobs = args.jobs if side.startswith("pack") or side == "probe" else 1
    if side == "pack_tokens":
        limits = engine.pack_batch_limits

        def scaled(jobs: int, world_size: int, max_seq_length: int) -> dict:
            from vllm.engine.arg_utils import EngineArgs
            from vllm.usage.usage_lib import UsageContext

            tokens, _ = EngineArgs.get_batch_defaults(world_size)
            out = limits(jobs, world_size, max_seq_length)
            out["max_num_batched_tokens"] = max(
                out.get("max_num_batched_tokens", 0), jobs * tokens[UsageContext.LLM_CLASS]
            )
            return out

        engine.pack_batch_limits = scaled
    cfg = from_overrides(path, *engine_keys(side, args.device), f"model.max_new_tokens={args.max_tokens}")
    adapters = random_adapters(path, jobs, dtype="bfloat16", for_sync=True)
    kwargs = rollout_args(cfg) | ({"lora_slots": jobs} if jobs > 1 else {})
    t0 = time.perf_counter()
    role = PackedRole(engine.VLLMRollout, [kwargs] * jobs)
    start_s = time.perf_counter() - t0
    for j, adapter in enumerate(adapters):
        role.on_job(j, "load_adapter", adapter)
    tok = role.role.tokenizer
    if side == "probe":
        probes = probe_side(role, adapters, demo_prompts(tok, 2 * jobs), cfg.sampling_for("probe"), args.repeats)
        return probes | {"engine_start_s": round(start_s, 1)}
    prompts = demo_prompts(tok, args.prompts * jobs)
    sampling = Sampling(n=args.n, temperature=1.0, max_tokens=args.max_tokens)

    def call(k: int) -> tuple[float, int]:
        calls = []
        for j in range(jobs):
            mine = prompts[j * args.prompts : (j + 1) * args.prompts]
            seeds = None if side == "pack_unseeded" else [prompt_seed(j, i, "train", k) for i in range(len(mine))]
            calls.append((j, (mine, sampling, seeds)))
        t = time.perf_counter()
        out = role.generate_jobs(calls)
        dt = time.perf_counter() - t
        return dt, sum(len(c.token_ids) for rollouts in out for r in rollouts for c in r.completions)

    call(0)  # warm-up: the full batch's kernels and allocations
    times, tokens = zip(*(call(k + 1) for k in range(args.repeats)))
    profile = python_profile(lambda: call(args.repeats + 1), args.profile) if args.profile else None
    role.close()
    samples = jobs * args.prompts * args.n
    return {
        "side": side,
        "jobs": jobs,
        "samples": samples,
        "call_s": [round(t, 3) for t in times],
        "median_s": round(median(list(times)), 3),
        "tokens": int(median(list(tokens))),
        "engine_start_s": round(start_s, 1),
        "engine_kwargs": {
            k: v
            for k, v in engine.engine_kwargs(
                cfg.model, cfg.cluster, max_seq_length=cfg.max_seq_length, seed=0, lora_slots=jobs
            ).items()
            if k.startswith(("max_num", "enforce", "max_lora", "enable_lora"))
        },
        **({"profile": profile} if profile else {}),
    }


def probe_side(role, adapters: list, prompts: list[list[int]], sampling, repeats: int) -> dict:
    """A pack's sync and probe on the engine, step after step: every job's next adapter version loaded
    (`load_adapter`: its folder written, the old slot's adapter removed), then the jobs' probe calls merged as a
    pack's are (2 prompts each, with the run's probe `sampling`: TrainConfig.sampling_for("probe")), which makes vLLM
    read each new adapter into its LoRA slot, then the same call again with the adapters resident. The first call
    less the second is what loading the new adapters costs the probe."""
    import dataclasses
    import time

    from rl.seeds import prompt_seed

    jobs = len(adapters)

    def probe(step: int) -> float:
        calls = [
            (j, (prompts[2 * j : 2 * j + 2], sampling, [prompt_seed(j, i, "probe", step) for i in (0, 1)]))
            for j in range(jobs)
        ]
        t = time.perf_counter()
        role.generate_jobs(calls)
        return time.perf_counter() - t

    load_s, first_s, again_s = [], [], []
    for k in range(repeats + 1):  # the first round warms the kernels up
        t = time.perf_counter()
        for j, adapter in enumerate(adapters):
            role.on_job(j, "load_adapter", dataclasses.replace(adapter, version=k + 2))
        loads, first, again = time.perf_counter() - t, probe(k), probe(k)
        if k:
            load_s.append(round(loads, 3))
            first_s.append(round(first, 3))
            again_s.append(round(again, 3))
    role.close()
    return {
        "side": "probe",
        "jobs": jobs,
        "samples": len(prompts) * sampling.n,
        "call_s": first_s,
        "median_s": median(first_s),
        "load_s": load_s,
        "resident_s": again_s,
    }


def probe_line(r: dict) -> str:
    loads, first, again = median(r["load_s"]), r["median_s"], median(r["resident_s"])
    return (
        f"probe, {r['jobs']} jobs: their adapter loads {loads:.3f} s, the probe call after them {first:.3f} s, the same "
        f"call with the adapters resident {again:.3f} s: vLLM's loading of the new adapters about {first - again:.3f} s"
    )


def table(rows: dict[str, dict]) -> str:
    """A markdown table of the sides, each side's seconds per sample against `solo`'s where it ran."""
    base = rows.get("solo")
    out = [
        "| side | jobs x samples | call s (median, spread) | samples/s | s per sample vs solo |",
        "|---|---|---|---|---|",
    ]
    for side, r in rows.items():
        per = r["median_s"] / r["samples"]
        vs = f"{per / (base['median_s'] / base['samples']):.2f}" if base else "-"
        out.append(
            f"| {side} | {r['jobs']} x {r['samples'] // r['jobs']} | {show_spread(spread(r['call_s']), ' s', 3)} | "
            f"{r['samples'] / r['median_s']:.0f} | {vs} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=32, help="prompts per job")
    ap.add_argument("--n", type=int, default=16, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--profile", type=int, default=0, help="also profile one call per side: the top N functions")
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)  # one side, in this process
    args = ap.parse_args()
    if args.side:
        print(json.dumps(run_side(args.side, args)), flush=True)
        return
    rows = {}
    for side in args.sides.split(","):
        rows[side] = run_side_process("bench.pack_engine", side, sys.argv[1:])
        profile = rows[side].pop("profile", None)
        print(json.dumps(rows[side]), flush=True)
        if profile:
            print(f"profile of one {side} call (cProfile, the engine's own thread):\n{profile}", flush=True)
    print(table(rows))
    if "probe" in rows:
        print(probe_line(rows["probe"]))
    append_result("pack-engine", {"sides": rows, "args": {k: v for k, v in vars(args).items() if k != "side"}})


if __name__ == "__main__":
    main()
