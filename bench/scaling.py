"""Rollout throughput against the number of rollout actors (1, 2) on a local Ray, and a projection of step time to
N GPUs from per-role throughputs.

CPU (5-9 min on the shared 2-core machine):  python -m bench.scaling [--shape tiny] [--actors 1,2] [--prompts 16] [--n 8]
Projection only, from GPU numbers measured with bench.rollout / bench.learner:
    python -m bench.scaling --project-only --rollout-tok-s 9000 --learner-tok-s 30000 --gpus 8

On this 2-core machine the measurement mostly shows overhead: two actors share two cores, so the best case is
the same tokens/s as one actor using both cores. It runs the actors twice: with the framework's CPU environment
(each actor's vLLM binds all cores: `cluster.actor_threads=null`) and pinned (actor i on core i).

The projection is a throughput model, not a measurement. Assumptions (printed with the numbers):
  - a step generates `gen_tokens` and trains on `train_tokens` (prompt + completion positions); prompts split
    evenly over the `a` actors and samples over the `l` learners; each role runs at its measured per-GPU
    tokens/s times a parallel efficiency (default: 1 for actors, which are independent; 0.9 for data-parallel
    learners, for the gradient all-reduce);
  - synchronous (staleness 0): step = generation + learning + sync; with staleness 1 the two overlap:
    step = max(generation, learning) + sync;
  - sync time is constant in N (one adapter, broadcast through the object store);
  - memory is not modelled (a role is assumed to fit on one GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict, dataclass

from bench.common import (
    append_result,
    demo_prompts,
    machine,
    machine_label,
    model_path,
    timed_generations,
    vllm_memory_fraction,
)


@dataclass
class Split:
    actors: int
    learners: int
    gen_s: float
    learn_s: float
    step_s: float
    samples_per_s: float


def step_time(
    actors: int,
    learners: int,
    *,
    rollout_tok_s: float,
    learner_tok_s: float,
    gen_tokens: float,
    train_tokens: float,
    sync_s: float,
    samples: int,
    actor_efficiency: float = 1.0,
    learner_efficiency: float = 0.9,
    overlap: bool = False,
) -> Split:
    """Modelled step time of one actor:learner split (see the module docstring for the assumptions)."""
    if actors < 1 or learners < 1:
        raise ValueError("a split needs at least one actor and one learner")
    gen = gen_tokens / (actors * rollout_tok_s * (actor_efficiency if actors > 1 else 1.0))
    learn = train_tokens / (learners * learner_tok_s * (learner_efficiency if learners > 1 else 1.0))
    step = (max(gen, learn) if overlap else gen + learn) + sync_s
    return Split(actors, learners, gen, learn, step, samples / step)


def project(gpus: int, **kw) -> list[Split]:
    """Every actor:learner split of `gpus` GPUs (one role per GPU), fastest first."""
    return sorted((step_time(a, gpus - a, **kw) for a in range(1, gpus)), key=lambda s: s.step_s)


# ------------------------------------------------------------------------------------------------ measurement


def actor_overrides(path: str, n_prompts: int, n_actors: int, args) -> list[str]:
    """Config overrides of each measured actor: its lengths and a vLLM memory share derived from this machine."""
    sequences = math.ceil(n_prompts * args.n / n_actors)
    share = vllm_memory_fraction(path, sequences, 448 + args.max_tokens)
    return [
        "model.max_prompt_tokens=448",
        f"model.max_new_tokens={args.max_tokens}",
        f"cluster.gpu_memory_utilization={share}",
    ]


def measure_actors(path: str, prompts: list[list[int]], n_actors: int, pinned: bool, args) -> dict:
    """Generated tokens/s of `n_actors` Ray rollout actors splitting one step's prompts (rl.runtime.runtime.Runtime)."""
    import ray

    from rl.app import rollout_args
    from rl.resolve import from_overrides
    from rl.rollout.vllm import VLLMRollout, cpu_threads_env
    from rl.runtime.groups import shard
    from rl.runtime.placement import RayGroup
    from rl.runtime.runtime import Runtime
    from rl.types import Sampling

    cores = os.cpu_count() or 1
    handles = []
    for i in range(n_actors):
        if pinned:  # actor i gets its own slice of the cores
            mine = shard(list(range(cores)), n_actors)[i] or [i % cores]
            env = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, mine)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        else:
            env = cpu_threads_env(None)  # what the framework sets with cluster.actor_threads=null
        handles.append(
            ray.remote(num_cpus=1, runtime_env={"env_vars": env})(VLLMRollout).remote(
                **rollout_args(from_overrides(path, *actor_overrides(path, len(prompts), n_actors, args)))
            )
        )
    ray.get([h.__ray_ready__.remote() for h in handles])
    runtime = Runtime(RayGroup(handles), RayGroup([]))
    sampling = Sampling(n=args.n, temperature=1.0, max_tokens=args.max_tokens)
    rates, _ = timed_generations(runtime.generate, prompts, sampling, args.repeats, warmup=2 * n_actors)
    for h in handles:
        ray.get(h.close.remote())
        ray.kill(h)
    rates.sort()
    return {"actors": n_actors, "pinned": pinned, "tokens_per_s": round(rates[len(rates) // 2], 1)}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model.path (default: the random --shape)")
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--actors", default="1,2")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--project-only", action="store_true", help="skip the measurement; project from the flags")
    ap.add_argument("--rollout-tok-s", type=float, default=None, help="per-actor tokens/s (default: measured)")
    ap.add_argument("--learner-tok-s", type=float, default=None, help="per-learner tokens/s (bench.learner)")
    ap.add_argument("--gen-tokens", type=float, default=8 * 8 * 20, help="generated tokens per step (demo ~1280)")
    ap.add_argument("--train-tokens", type=float, default=8 * 8 * 77, help="trained positions per step (demo)")
    ap.add_argument("--samples", type=int, default=64, help="completions per step")
    ap.add_argument("--sync-s", type=float, default=0.5)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--overlap", action="store_true", help="staleness 1: generation overlaps learning")
    return ap


def main() -> None:
    args = parser().parse_args()
    args.device = "cpu"

    measured = []
    info = machine()
    if not args.project_only:
        from transformers import AutoTokenizer

        from rl.runtime import placement

        if args.model:
            args.shape = None
        path = model_path(args)
        prompts = demo_prompts(AutoTokenizer.from_pretrained(path), args.prompts)
        started = placement.start_ray(None, 8)
        try:
            for pinned in (False, True):
                for a in (int(x) for x in args.actors.split(",")):
                    if a == 1 and pinned:
                        continue  # one actor: pinned to all cores is the framework's setting
                    measured.append(measure_actors(path, prompts, a, pinned, args))
                    print(
                        json.dumps({"bench": "scaling", **measured[-1], "load_avg": machine()["load_avg"]}), flush=True
                    )
        finally:
            placement.stop_ray(started)
        info = machine()
    one = next((m["tokens_per_s"] for m in measured if m["actors"] == 1), None)
    rollout = args.rollout_tok_s or one
    learner = args.learner_tok_s or 2 * (rollout or 1)  # a stated guess when not given; see the assumptions
    kw = dict(
        rollout_tok_s=rollout,
        learner_tok_s=learner,
        gen_tokens=args.gen_tokens,
        train_tokens=args.train_tokens,
        sync_s=args.sync_s,
        samples=args.samples,
        overlap=args.overlap,
    )
    splits = project(args.gpus, **kw)
    assumptions = {
        "rollout_tok_s_per_gpu": rollout,
        "learner_tok_s_per_gpu": learner,
        "learner_tok_s_source": "flag" if args.learner_tok_s else "guess: 2x rollout (pass --learner-tok-s)",
        "gen_tokens": args.gen_tokens,
        "train_tokens": args.train_tokens,
        "sync_s": args.sync_s,
        "overlap": args.overlap,
        "actor_efficiency": 1.0,
        "learner_efficiency": 0.9,
        "memory": "not modelled",
    }
    print(json.dumps({"bench": "scaling", "measured": measured, "machine": info, "assumptions": assumptions}))
    print(json.dumps({"bench": "scaling", "projection_gpus": args.gpus, "splits": [asdict(s) for s in splits[:3]]}))
    if measured:
        cells = " | ".join(
            f"{m['actors']} actor{'s' if m['actors'] > 1 else ''}{' pinned' if m['pinned'] else ''}: "
            f"{m['tokens_per_s']:.0f} tok/s"
            for m in measured
        )
        print(
            f"| rollout vs actors ({args.shape or args.model}, {args.prompts} x {args.n}) | {cells} | {machine_label(info)} |"
        )
        append_result("scaling", {"measured": measured}, info=info)  # a projection alone is a model, not a result
    best, base = splits[0], step_time(1, 1, **kw)
    print(
        f"| projection, {args.gpus} GPUs ({rollout:.0f} / {learner:.0f} tok/s per actor / learner) "
        f"| 1a:1l step {base.step_s:.2f} s | best split {best.actors}a:{best.learners}l, step {best.step_s:.2f} s, "
        f"{best.samples_per_s:.1f} samples/s (**{base.step_s / best.step_s:.2f}x**) |"
    )


if __name__ == "__main__":
    main()
