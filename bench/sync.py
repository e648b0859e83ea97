"""Adapter sync: time against adapter size (LoRA rank 8/16/32/64) and where it goes, on the real path (Ray
actors: Learner -> object store -> VLLMRollout), plus its share of a step of the demo's shapes.

CPU (about 8 min on the shared 2-core machine; --micro-only: 1 min):  python -m bench.sync [--ranks 8,16,32,64] [--modes merged,native] [--repeats 3]
    [--metrics outputs/<run>/metrics.jsonl]

Per rank and lora_mode it runs `Runtime.sync()` as the driver does (learner 0's `get_adapter` -> driver ->
`ray.put` -> every actor's `load_adapter`), then the same pieces one by one, each timed where it runs:
  learner_state_dict_s  PEFT state dict, to CPU (in the learner)
  learner_serialize_s   safetensors bytes (in the learner)
  to_driver_s           Ray call + result transfer learner -> driver, minus the two above
  to_actor_s            ray.put + call to the actor, minus the actor's own load time
  merged mode (inside the vLLM worker, through `collective_rpc` of an instrumented copy of rl/rollout/vllm_ext.py's
  merge):
    rpc_s (engine IPC round trip), worker_deserialize_s, worker_delta_s (B @ A), worker_payload_s (W0 + dW),
    worker_reload_s (vLLM layerwise reload: load_weights + CPU weight repacking), reset_prefix_cache_s
  native mode: write_files_s, and first_generate_extra_s (vLLM loads a LoRARequest lazily, at its first use:
    a 1-token generate right after the load, minus the same generate again).
The prototypes (merged mode, same actor and learner): 1. the learner's ObjectRef handed straight to the actor
(no copy through the driver); 2. the adapter sent in bf16 (half the bytes; the merged weights are bf16 anyway);
3. W0 + s * B @ A as one fused addmm per module in the worker (no separate delta pass; what the actor runs).
The step share: a demo-shaped step on the same actors (8 prompts x 8 samples x 32 tokens, GRPO with the k3 KL,
rank 16) through rl.runtime.runtime.Runtime: generate, train_step, sync, probe; and, with --metrics, the mean
time/sync_s / time/step_s of a real run's metrics.jsonl.

Past 400 lines because each piece above is timed by its own small instrumented copy of the real call, kept in one
script so that all of them run on the same actors in one process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.common import (
    add_threads_arg,
    append_result,
    demo_prompts,
    learner_config,
    machine,
    machine_label,
    vllm_memory_fraction,
)
from rl.learner import Learner
from rl.resolve import from_overrides
from rl.rollout.vllm import VLLMRollout

# ------------------------------------------------------------------------------------------------ roles


class BenchLearner(Learner):
    """Learner plus timed copies of get_adapter's two parts (state dict, serialisation)."""

    def timed_adapter(self, dtype: str | None = None):
        import torch
        from peft import get_peft_model_state_dict
        from safetensors.torch import save

        from rl.types import Adapter

        t0 = time.perf_counter()
        cast = getattr(torch, dtype) if dtype else None
        state = {
            k: (v.detach().to("cpu", dtype=cast) if cast else v.detach().to("cpu")).contiguous()
            for k, v in get_peft_model_state_dict(self.model).items()
        }
        t1 = time.perf_counter()
        weights = save(state)
        t2 = time.perf_counter()
        config = self.model.peft_config["default"].to_dict()
        config["target_modules"] = sorted(config["target_modules"])
        adapter = Adapter(version=self.version, config=config, weights=weights)
        return adapter, {"learner_state_dict_s": t1 - t0, "learner_serialize_s": t2 - t1}

    def bump_version(self) -> int:
        """A new adapter version without a step: every sync in this bench publishes a new version, as the driver
        does (VLLMRollout in native mode must not be given the same version twice: it would delete the files of
        the adapter it serves, see the report)."""
        self.version += 1
        return self.version

    def randomise_adapter(self, version: int) -> None:
        """Non-zero B (a trained-looking adapter), as a new version."""
        import torch

        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 1e-3)
        self.version = version


def timed_merge(worker, config: dict, weights: bytes) -> dict:
    """The unfused merge, the baseline of the fused addmm (all deltas B @ A, then W0.float() + delta), with a timer
    around each part; the reload is the extension's own (runs in the worker)."""
    from safetensors.torch import load as load_safetensors

    from bench.common import lora_deltas
    from rl.rollout.vllm_ext import _FUSED, _SIBLINGS

    t = [time.perf_counter()]
    base = worker._rlft_base()
    tensors = load_safetensors(weights)
    t.append(time.perf_counter())
    deltas = lora_deltas(config, tensors)
    t.append(time.perf_counter())
    names: set[str] = set()
    for module in deltas:
        prefix, _, proj = module.rpartition(".")
        group = _FUSED.get(proj)
        names.update(f"{prefix}.{s}.weight" for s in (_SIBLINGS[group] if group else (proj,)))
    payload = []
    for name in sorted(names):
        w0 = base[name]
        delta = deltas.get(name.removesuffix(".weight"))
        payload.append((name, w0 if delta is None else (w0.float() + delta).to(w0.dtype)))
    t.append(time.perf_counter())
    worker._rlft_reload(payload)
    t.append(time.perf_counter())
    parts = ("worker_deserialize_s", "worker_delta_s", "worker_payload_s", "worker_reload_s")
    return {k: b - a for k, a, b in zip(parts, t, t[1:])}


def fused_merge(worker, config: dict, weights: bytes) -> dict:
    """The production merge (rl/rollout/vllm_ext.py `merged_payload`, prototype 3): W0 + s * B @ A as one `addmm`
    per module in the weights' dtype (`merge_lora`; no separate delta tensor, one pass instead of three: B @ A,
    W0.float() + delta, and the dict of deltas in between). Timed like `timed_merge`; the reload is the same."""
    from safetensors.torch import load as load_safetensors

    from rl.rollout.vllm_ext import lora_factors, merged_payload

    t = [time.perf_counter()]
    base = worker._rlft_base()
    tensors = load_safetensors(weights)
    t.append(time.perf_counter())
    payload = list(merged_payload(base, *lora_factors(config, tensors)))
    t.append(time.perf_counter())
    worker._rlft_reload(payload)
    t.append(time.perf_counter())
    parts = ("worker_deserialize_s", "worker_merge_s", "worker_reload_s")
    return {k: b - a for k, a, b in zip(parts, t, t[1:])}


class BenchRollout(VLLMRollout):
    """VLLMRollout plus a load with each part timed (same work as load_adapter)."""

    def fused_load(self, adapter) -> dict:
        """PROTOTYPE 3 on this engine: the fused merge, then the prefix-cache reset, as load_adapter does."""
        worker = self.llm.collective_rpc(fused_merge, args=(adapter.config, adapter.weights))[0]
        self.llm.reset_prefix_cache()
        self.version = adapter.version
        return worker

    def timed_load(self, adapter) -> dict:

        from rl.types import Sampling

        out: dict[str, float] = {}
        if self.lora_mode == "merged":
            t0 = time.perf_counter()
            worker = self.llm.collective_rpc(timed_merge, args=(adapter.config, adapter.weights))[0]
            t1 = time.perf_counter()
            self.llm.reset_prefix_cache()
            t2 = time.perf_counter()
            out.update(worker)
            out["rpc_s"] = (t1 - t0) - sum(worker.values())
            out["reset_prefix_cache_s"] = t2 - t1
        else:
            t0 = time.perf_counter()
            self._swap_native_adapter(adapter)
            out["write_files_s"] = time.perf_counter() - t0
            one = Sampling(n=1, temperature=0.0, max_tokens=1)
            t0 = time.perf_counter()
            self.generate([[1, 2, 3]], one)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            self.generate([[1, 2, 3]], one)
            out["first_generate_extra_s"] = max(first - (time.perf_counter() - t0), 0.0)
        self.version = adapter.version
        out["actor_total_s"] = sum(out.values())
        return out


# ------------------------------------------------------------------------------------------------ measurements


def breakdown(ray, learner, actor, dtype: str | None = None) -> dict:
    """One sync, piece by piece, each timed where it runs."""
    ray.get(learner.bump_version.remote())
    t0 = time.perf_counter()
    adapter, parts = ray.get(learner.timed_adapter.remote(dtype))
    parts["to_driver_s"] = time.perf_counter() - t0 - sum(parts.values())
    t0 = time.perf_counter()
    ref = ray.put(adapter)
    loaded = ray.get(actor.timed_load.remote(ref))
    parts["to_actor_s"] = time.perf_counter() - t0 - loaded.pop("actor_total_s")
    parts.update(loaded)
    parts["total_s"] = sum(parts.values())
    parts["adapter_mb"] = adapter.nbytes / 2**20
    return parts


def fused_breakdown(ray, learner, actor) -> dict:
    ray.get(learner.bump_version.remote())
    adapter = ray.get(learner.get_adapter.remote())
    return ray.get(actor.fused_load.remote(ray.put(adapter)))


def direct_sync(ray, learner, actor) -> float:
    """PROTOTYPE 1: hand the learner's result to the actor as an ObjectRef (no copy through the driver)."""
    ray.get(learner.bump_version.remote())
    t0 = time.perf_counter()
    ref = learner.get_adapter.remote()
    ray.get(actor.load_adapter.remote(ref))
    return time.perf_counter() - t0


def median_dict(rows: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}


def demo_step(ray, runtime, prompts, version: int) -> dict:
    """One demo-shaped step through rl.runtime.runtime.Runtime; random rewards stand in for the task reward."""
    import random

    from rl.loop.prepare import prepare_samples
    from rl.types import Sampling

    rng = random.Random(version)
    t = {}
    t0 = time.perf_counter()
    rollouts = runtime.generate(prompts, Sampling(n=8, temperature=1.0, max_tokens=32))
    t["rollout_s"] = time.perf_counter() - t0
    rewards = [float(rng.random() < 0.5) for r in rollouts for _ in r.completions]
    knobs = from_overrides("/unused", "model.max_new_tokens=32")
    samples, _, _ = prepare_samples(rollouts, rewards, knobs.algorithm, knobs.completion_tokens)
    t0 = time.perf_counter()
    runtime.train_step(samples)
    t["learn_s"] = time.perf_counter() - t0
    t["sync_s"] = runtime.sync()["time/sync_s"]
    t0 = time.perf_counter()
    runtime.probe_finish(runtime.probe_submit(prompts[:2], Sampling(n=2, temperature=1.0, max_tokens=16)))
    t["probe_s"] = time.perf_counter() - t0
    t["step_s"] = sum(t.values())
    return t


def merge_math_micro(path: str, rank: int, repeats: int) -> dict:
    """The actor's merge arithmetic alone, in this process (no engine, no IPC), timed in turns: bench/common.py's
    `lora_deltas` + `W0.float() + dW` (the unfused form) against one fused fp32 `addmm` per module, and against
    `merge_lora` (what the actor runs: one addmm in the weights' dtype), on the model's real projection weights and a
    random rank-`rank` adapter on all 7 projections. Checks that the fp32 forms give bit-identical merged weights and
    counts how many elements the weight-dtype merge rounds differently (and by how much)."""
    import torch
    from safetensors.torch import load_file

    from bench.common import lora_deltas
    from rl.rollout.vllm_ext import merge_lora

    base = {}
    for f in sorted(__import__("pathlib").Path(path).glob("*.safetensors")):
        base.update({k: v for k, v in load_file(str(f)).items() if k.endswith("_proj.weight")})
    g = torch.Generator().manual_seed(0)
    config = {"r": rank, "lora_alpha": 2 * rank}
    weights = {}
    for name, w in base.items():
        module = name.removesuffix(".weight")
        weights[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, w.shape[1], generator=g) * 0.02
        weights[f"base_model.model.{module}.lora_B.weight"] = torch.randn(w.shape[0], rank, generator=g) * 1e-3

    def today() -> dict:
        deltas = lora_deltas(config, weights)
        return {n: (w.float() + deltas[n.removesuffix(".weight")]).to(w.dtype) for n, w in base.items()}

    def fused() -> dict:
        scale = config["lora_alpha"] / config["r"]
        out = {}
        for n, w in base.items():
            m = f"base_model.model.{n.removesuffix('.weight')}"
            out[n] = torch.addmm(w.float(), weights[m + ".lora_B.weight"], weights[m + ".lora_A.weight"], alpha=scale)
            out[n] = out[n].to(w.dtype)
        return out

    def actor() -> dict:
        scale = config["lora_alpha"] / config["r"]
        out = {}
        for n, w in base.items():
            m = f"base_model.model.{n.removesuffix('.weight')}"
            out[n] = merge_lora(w, weights[m + ".lora_B.weight"], weights[m + ".lora_A.weight"], scale)
        return out

    a, b, c = today(), fused(), actor()
    identical = all(torch.equal(a[n], b[n]) for n in a)
    differing = sum(int((b[n] != c[n]).sum()) for n in b) / sum(b[n].numel() for n in b)
    max_diff = max(float((b[n].float() - c[n].float()).abs().max()) for n in b)
    times = {"today_s": [], "fused_s": [], "actor_s": []}
    for _ in range(repeats):
        for key, fn in (("today_s", today), ("fused_s", fused), ("actor_s", actor)):
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    out = {k: round(statistics.median(v), 4) for k, v in times.items()}
    return {
        "rank": rank,
        **out,
        "speedup": round(out["today_s"] / out["fused_s"], 2),
        "actor_speedup_over_fused": round(out["fused_s"] / out["actor_s"], 2),
        "bit_identical": identical,
        "actor_vs_fused_differing_frac": round(differing, 5),
        "actor_vs_fused_max_abs_diff": max_diff,
    }


def metrics_share(path: str) -> dict:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if "time/sync_s" in r and "time/step_s" in r]
    sync = statistics.mean(r["time/sync_s"] for r in rows)
    step = statistics.mean(r["time/step_s"] for r in rows)
    return {
        "metrics": path,
        "steps": len(rows),
        "sync_s": round(sync, 3),
        "step_s": round(step, 2),
        "sync_share": round(sync / step, 4),
    }


def actor_overrides(path: str, mode: str, rank: int) -> list[str]:
    """Config overrides of the bench's actor: LoRA mode and rank, lengths, and a vLLM memory share derived from this
    machine that holds the demo-shaped step (8 prompts x 8 samples) at once."""
    share = vllm_memory_fraction(path, 64, 448 + 64, lora_rank=rank if mode == "native" else 0)
    keys = [f"cluster.lora_mode={mode}", f"model.lora_rank={rank}", "model.max_prompt_tokens=448"]
    return keys + ["model.max_new_tokens=64", f"cluster.gpu_memory_utilization={share}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--ranks", default="8,16,32,64")
    ap.add_argument("--modes", default="merged,native")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--demo-steps", type=int, default=2, help="demo-shaped steps for the step share (0: skip)")
    ap.add_argument("--metrics", default=None, help="a run's metrics.jsonl: also report its sync share")
    ap.add_argument("--micro-only", action="store_true", help="only the in-process merge-arithmetic comparison")
    add_threads_arg(ap)
    args = ap.parse_args()

    import ray
    from transformers import AutoTokenizer

    from rl.app import learner_args, rollout_args
    from rl.model_path import resolve_model_path
    from rl.rollout.vllm import cpu_threads_env
    from rl.runtime import placement
    from rl.runtime.runtime import Runtime

    path = resolve_model_path(args.model)
    ranks = [int(r) for r in args.ranks.split(",")]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    micro = [merge_math_micro(path, r, max(args.repeats, 5)) for r in ranks]
    for row in micro:
        print(json.dumps({"bench": "sync", "merge_math": row}), flush=True)
    if args.micro_only:
        cells = " | ".join(
            f"r={m['rank']}: {m['today_s']:.3f} -> {m['fused_s']:.3f} -> {m['actor_s']:.3f} s "
            f"({m['actor_vs_fused_differing_frac']:.2%} elements 1 ulp apart)"
            for m in micro
        )
        print(
            f"| actor merge arithmetic, unfused fp32 -> fused fp32 addmm -> addmm in the weights' dtype (the actor's) "
            f"| {cells} | {machine_label(machine())} |"
        )
        append_result("sync", {"merge_math": micro})
        return
    prompts = demo_prompts(AutoTokenizer.from_pretrained(path), 8)
    before = machine()
    started = placement.start_ray(None, 8)  # logical CPUs: roles take turns on the 2 real cores
    actor_env = {**cpu_threads_env(args.threads), "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # timed_merge is a callable
    results, share = [], {}
    version = 0
    actor = learner = None
    try:
        for mode in args.modes.split(","):
            # one actor and one learner alive at a time: the machine is shared and a learner is ~0.6 GB
            keys = actor_overrides(path, mode, max(ranks))
            actor = ray.remote(num_cpus=1, runtime_env={"env_vars": actor_env})(BenchRollout).remote(
                **rollout_args(from_overrides(path, *keys))
            )
            ray.get(actor.__ray_ready__.remote())
            for r in ranks:
                # the demo's GRPO (its KL is used by the demo-shaped step); LoRA factors sent in bf16, as a run
                # does for a bf16 vLLM engine
                cfg = learner_config(path, "algorithm.kl_coef=0.01", rank=r, dtype="bfloat16", threads=args.threads)
                learner = ray.remote(num_cpus=1)(BenchLearner).remote(**learner_args(cfg))
                version += 1
                ray.get(learner.randomise_adapter.remote(version))
                runtime = Runtime(placement.RayGroup([actor]), placement.RayGroup([learner]))
                runtime.sync()  # warm-up (merged: the worker reads the base weights once)
                synced = []
                for _ in range(args.repeats):
                    ray.get(learner.bump_version.remote())
                    synced.append(runtime.sync()["time/sync_s"])
                parts = median_dict([breakdown(ray, learner, actor) for _ in range(args.repeats)])
                row = {"mode": mode, "rank": r, "sync_s": round(statistics.median(synced), 4), **parts}
                if mode == "merged":  # the prototypes, on the same actor and learner
                    row["proto_direct_ref_s"] = round(
                        statistics.median(direct_sync(ray, learner, actor) for _ in range(args.repeats)), 4
                    )
                    bf16 = median_dict([breakdown(ray, learner, actor, "bfloat16") for _ in range(args.repeats)])
                    row["proto_bf16_total_s"], row["proto_bf16_mb"] = bf16["total_s"], bf16["adapter_mb"]
                    fused = median_dict([fused_breakdown(ray, learner, actor) for _ in range(args.repeats)])
                    row["proto_fused_merge_s"] = fused["worker_merge_s"]
                    row["proto_fused_reload_s"] = fused["worker_reload_s"]
                results.append(row)
                print(json.dumps({"bench": "sync", **row}), flush=True)
                if mode == "merged" and r == 16 and args.demo_steps:
                    runtime.version = ray.get(learner.get_adapter.remote()).version
                    runtime.sync()
                    steps = [demo_step(ray, runtime, prompts, i) for i in range(args.demo_steps)]
                    share = median_dict(steps)
                    share["sync_share"] = round(share["sync_s"] / share["step_s"], 4)
                    print(json.dumps({"bench": "sync", "demo_step": share}), flush=True)
                ray.kill(learner)
                learner = None
            ray.get(actor.close.remote())
            ray.kill(actor)
            actor = None
    finally:
        for h in (actor, learner):
            if h is not None:
                ray.kill(h)
        placement.stop_ray(started)
    info = machine()
    info["load_avg_before"] = before["load_avg"]
    from_metrics = metrics_share(args.metrics) if args.metrics else None
    print(json.dumps({"bench": "sync", "machine": info, "demo_step": share, "from_metrics": from_metrics}))
    by = {(r["mode"], r["rank"]): r for r in results}
    cells = " | ".join(
        f"r={r}: {by[('merged', r)]['adapter_mb']:.1f} MB, merged {by[('merged', r)]['sync_s']:.2f} s"
        + (f", native {by[('native', r)]['sync_s']:.2f} s" if ("native", r) in by else "")
        for r in ranks
        if ("merged", r) in by
    )
    step = f"demo-shaped step {share['step_s']:.1f} s, sync {100 * share['sync_share']:.1f}%" if share else ""
    if from_metrics:
        step += f"; run {from_metrics['metrics']}: {100 * from_metrics['sync_share']:.1f}%"
    print(f"| adapter sync (SmolLM2, all 7 projections) | {cells} | {step} | {machine_label(info)} |")
    append_result(
        "sync", {"merge_math": micro, "syncs": results, "demo_step": share, "from_metrics": from_metrics}, info=info
    )


if __name__ == "__main__":
    main()
