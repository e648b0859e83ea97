"""GPU work the gpu tests run, each job in a fresh process: `python -m tests.gpu.jobs NAME '<json args>'` prints one
line `RESULT <json>`. A fresh process because Unsloth must be a process's first ML import (the parent sets
RLFT_IMPORT_UNSLOTH=1, which rl/__init__.py reads), and an in-process vLLM engine is not torn down cleanly.

Every job builds its roles from a resolved config as a run does (rl.resolve.from_overrides), on one GPU.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rl.resolve import from_overrides  # the first ML-adjacent import: rl/__init__.py may import unsloth first

PROMPTS = [
    "What is 7 + 5? Give the final answer as a number at the end.",
    "What is 9 - 4? Give the final answer as a number at the end.",
    "Name the capital of France.",
    "Write one word that rhymes with cat.",
]
COMPLETIONS = ["12", "The answer is 12.", "7 + 5 = 13", "I do not know."]

LEARNER = {  # config overrides per learner kind
    "peft_bf16": ["model.learner_backend=peft", "model.load_in_4bit=false"],
    "peft_bnb": ["model.learner_backend=peft", "model.load_in_4bit=true"],
    "unsloth": ["model.learner_backend=unsloth", "model.load_in_4bit=true"],
}
COMMON = ["cluster.use_gpu=true", "model.learner_dtype=bfloat16", "algorithm.kl_coef=0", "algorithm.lr=1e-3"]


def chat_ids(tokenizer, text: str) -> list[int]:
    enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def fixed_batch(tokenizer):
    """4 prompts x 4 fixed completions (real text, so a real model gives them varied logprobs), advantages +1/-1."""
    from rl.types import TrainSample

    out = []
    for p in PROMPTS:
        ids = chat_ids(tokenizer, p)
        for k, c in enumerate(COMPLETIONS):
            comp = tokenizer(c + "<|im_end|>", add_special_tokens=False)["input_ids"]
            out.append(TrainSample(ids, comp, [0.0] * len(comp), 1.0 if k % 2 == 0 else -1.0))
    return out


def learner(model: str, kind: str) -> dict:
    """Logprobs of the fixed batch under a fresh learner of this kind, then three on-policy steps on it."""
    from transformers import AutoTokenizer

    from rl.app import learner_args
    from rl.learner import Learner

    learner = Learner(**learner_args(from_overrides(model, *COMMON, *LEARNER[kind])))
    samples = fixed_batch(AutoTokenizer.from_pretrained(model))
    logprobs = learner.sequence_logprobs([s.prompt_ids for s in samples], [s.completion_ids for s in samples])
    for s, lp in zip(samples, logprobs):
        s.old_logprobs = lp  # on-policy: the first step's ratio is 1
    steps = [learner.train_step(samples) for _ in range(3)]
    import torch

    return {
        "logprobs": logprobs,
        "losses": [m["train/loss"] for m in steps],
        "skipped": [m["train/skipped_nonfinite"] for m in steps],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def actor_vs_learner(model: str, lora_mode: str) -> dict:
    """A CUDA vLLM actor and a PEFT learner on one GPU, as a run builds them: the probe floor on the base model, a
    training step on an adapter made to matter, a sync, its probe, then greedy tokens of the actor against the
    learner's own greedy decoding with the same adapter."""
    import torch
    from transformers import AutoTokenizer

    from rl.app import learner_args, rollout_args
    from rl.learner import Learner
    from rl.loop.probe import SyncProbe
    from rl.rollout.vllm import VLLMRollout
    from rl.runtime.groups import LocalGroup
    from rl.runtime.runtime import Runtime
    from rl.types import Sampling

    cfg = from_overrides(
        model,
        *COMMON,
        *LEARNER["peft_bf16"],
        f"cluster.lora_mode={lora_mode}",
        "cluster.gpu_memory_utilization=0.3",
        "model.max_new_tokens=24",
    )
    actor = VLLMRollout(**rollout_args(cfg))  # engines first: vLLM measures free memory while it starts
    lrn = Learner(**learner_args(cfg))
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    runtime = Runtime(LocalGroup([actor]), LocalGroup([lrn]), cfg.cluster)
    probe = SyncProbe(runtime, prompts[:2], cfg.sampling_for("probe"), threshold=0.2, deferred=False)
    floor = probe.measure_floor()
    greedy = Sampling(n=1, temperature=0.0, max_tokens=16)
    base = [r.completions[0].token_ids for r in actor.generate(prompts, greedy)]
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():  # an adapter that changes the answers, so that a missed sync would show
        for name, p in lrn.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen).to(p) * 0.02)
    samples = fixed_batch(tok)
    lp = lrn.sequence_logprobs([s.prompt_ids for s in samples], [s.completion_ids for s in samples])
    for s, x in zip(samples, lp):
        s.old_logprobs = x
    lrn.train_step(samples)
    sync = runtime.sync()
    probe_diff = probe.after_sync(1, last=True)["sync/logprob_abs_diff"]
    rollouts = actor.generate(prompts, greedy)
    ours = [r.completions[0].token_ids for r in rollouts]
    learner_greedy = [r.completions[0].token_ids for r in lrn.generate(prompts, greedy)]
    rescored = lrn.sequence_logprobs(prompts, ours)
    diffs = [abs(a - b) for r, lp in zip(rollouts, rescored) for a, b in zip(r.completions[0].logprobs, lp)]
    merges = {}
    if lora_mode == "merged":
        merges = in_place_vs_layerwise(actor, lrn.get_adapter(for_sync=True)) | ipc_vs_bytes(actor, lrn)
    actor.close()
    return merges | {
        "floor": floor,
        "probe": probe_diff,
        "limit": probe.limit,
        "version": [r.adapter_version for r in rollouts],
        "sync_s": sync["time/sync_s"],
        "base": base,
        "actor": ours,
        "learner": learner_greedy,
        "logprob_abs_diff": sum(diffs) / max(len(diffs), 1),
    }


def quantized_mismatch(model: str, kind: str, actor_base: str) -> dict:
    """A 4-bit learner of `kind` and a CUDA vLLM actor on the base `model.actor_base` names, before any training:
    the mean |logp difference| per token on the actor's samples of 8 prompts x 4 (bench/quantized_base.py
    `sampled_mismatch`), and with `quantized` whether vLLM's NF4 codes are the learner's."""
    from transformers import AutoTokenizer

    from bench.quantized_base import make_actor_base, nf4_codes, sampled_mismatch
    from rl.app import learner_args, rollout_args
    from rl.learner import Learner
    from rl.rollout.vllm import VLLMRollout

    cfg = from_overrides(
        model,
        *COMMON,
        *LEARNER[kind],
        f"model.actor_base={actor_base}",
        "cluster.gpu_memory_utilization=0.3",
        "model.max_new_tokens=64",
    )
    made_s = make_actor_base(cfg)
    actor = VLLMRollout(**rollout_args(cfg))
    lrn = Learner(**learner_args(cfg))
    tok = AutoTokenizer.from_pretrained(model)
    mismatch, tokens = sampled_mismatch(actor, lrn, [chat_ids(tok, p) for p in PROMPTS * 2])
    codes = nf4_codes(actor, lrn) if actor_base == "quantized" else None
    actor.close()
    return {
        "mismatch": mismatch,
        "tokens": tokens,
        "actor_path": cfg.model.actor_path,
        "made_s": made_s,
        "codes": codes,
    }


def in_place_vs_layerwise(actor, adapter) -> dict:
    """The merged adapter written in place into the engine's parameters (the CUDA path) against the same adapter
    through vLLM's layerwise reload: every projection weight, and the merge's time (median of 3) each way."""
    import statistics

    def merge(worker, in_place: bool):
        saved = worker._rlft_in_place
        worker._rlft_in_place = saved if in_place else None
        try:
            times = [worker.rlft_merge_adapter(adapter.config, adapter.weights)["seconds"] for _ in range(3)]
        finally:
            worker._rlft_in_place = saved
        weights = {n: p.detach().clone() for n, p in worker.model_runner.model.named_parameters() if "_proj" in n}
        return saved is not None, statistics.median(times), weights

    used, fast_s, fast = actor.llm.collective_rpc(merge, args=(True,))[0]
    _, slow_s, slow = actor.llm.collective_rpc(merge, args=(False,))[0]
    diff = max(float((fast[n].float() - slow[n].float()).abs().max()) for n in slow)
    return {
        "in_place": used,
        "in_place_s": fast_s,
        "layerwise_s": slow_s,
        "in_place_vs_layerwise": diff,
        "weights_compared": len(slow),
        "same_names": sorted(fast) == sorted(slow),
    }


def ipc_vs_bytes(actor, lrn) -> dict:
    """The same adapter merged from its bytes and through a CUDA IPC handle (`cluster.weight_sync=ipc`): every
    projection weight after each, with a return to the base model between them so that the IPC merge has to write
    them. CUDA IPC memory opens only in another process, and this job's engine runs in this one: the handle comes
    from a child process that packs the adapter's factors on the GPU as the learner does (`IpcExport`)."""
    import multiprocessing

    def weights(worker):
        return {n: p.detach().clone() for n, p in worker.model_runner.model.named_parameters() if "_proj" in n}

    adapter = lrn.get_adapter(for_sync=True)
    actor.load_adapter(adapter)
    by_bytes = actor.llm.collective_rpc(weights)[0]
    actor.llm.collective_rpc("rlft_merge_adapter", args=({}, b""))  # back to the base model
    base = actor.llm.collective_rpc(weights)[0]
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    producer = ctx.Process(target=ipc_producer, args=(child_conn, adapter.config, adapter.weights))
    producer.start()
    try:
        load = actor.load_weights_ipc(conn.recv(), adapter.version)
    finally:
        conn.send("merged")
        producer.join(120)
    by_ipc = actor.llm.collective_rpc(weights)[0]

    def max_diff(x, y):
        return max(float((x[n].float() - y[n].float()).abs().max()) for n in y)

    return {
        "ipc_vs_bytes": max_diff(by_ipc, by_bytes),
        "base_vs_bytes": max_diff(base, by_bytes),
        "ipc_load_s": load["seconds"],
        "ipc_version": actor.version,
    }


def ipc_producer(conn, config: dict, weights: bytes) -> None:
    """The learner's half of the IPC sync in a process of its own: the adapter's tensors on the GPU, packed behind
    one handle by `IpcExport.packed_handles`, kept alive until the engine says it merged them."""
    import torch
    from safetensors.torch import load

    from rl.learner.export import IpcExport

    device = torch.device("cuda", 0)
    ipc = IpcExport()
    conn.send(ipc.packed_handles([(k, v.to(device)) for k, v in load(weights).items()], config, device))
    conn.recv()
    ipc.release()


def packed_vs_padded(model: str, kind: str, attention: str) -> dict:
    """The fixed batch plus long completions (20-600 tokens), padded and packed (`micro_batch_tokens`, the given
    `packed_attention`), both in bf16, each against the padded layout in fp32 (where no attention kernel's bf16
    rounding enters): logprob errors, and the loss and gradient norm of one step, each learner from its own
    logprobs as the old policy's (ratio 1 on both sides: the step compares the layouts' gradients, not how their
    rounding moves ratios across the clip). A packed learner that is refused (at config load: Unsloth replaces the
    attention forward; at start: no varlen kernel) or that falls back to padded micro-batches (its attention mixes
    the packed sequences: Batcher.check_packing) reports why."""
    import warnings

    import torch
    from transformers import AutoTokenizer

    from rl.app import learner_args
    from rl.config.schema import ConfigError
    from rl.learner import Learner
    from rl.learner.packing import varlen_kernel
    from rl.types import TrainSample

    tokenizer = AutoTokenizer.from_pretrained(model)
    samples = fixed_batch(tokenizer)
    text = tokenizer(" ".join(PROMPTS + COMPLETIONS) * 12, add_special_tokens=False)["input_ids"]
    for i, n in enumerate((20, 150, 600, 333)):  # the spread a real step has
        samples.append(TrainSample(samples[4 * i].prompt_ids, text[:n], [0.0] * n, 1.0 if i % 2 else -1.0))
    prompts, comps = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    keys = [*COMMON, *LEARNER[kind], "model.max_new_tokens=600", "algorithm.max_grad_norm=0"]

    def logprobs_and_step(learner) -> tuple[list[list[float]], dict]:
        lp = learner.sequence_logprobs(prompts, comps)
        own = [TrainSample(s.prompt_ids, s.completion_ids, old, s.advantage) for s, old in zip(samples, lp)]
        return lp, learner.train_step(own)

    fp32 = [k for k in COMMON if not k.startswith("model.learner_dtype")] + ["model.learner_dtype=float32"]
    fp32 += [
        *LEARNER["peft_bf16"],
        "model.max_new_tokens=600",
        "learner.micro_batch_size=4",
        "learner.micro_batch_tokens=0",
    ]
    reference = Learner(**learner_args(from_overrides(model, *fp32)))  # PEFT, fp32 base weights, padded
    ref = reference.sequence_logprobs(prompts, comps)
    del reference
    padded = Learner(
        **learner_args(from_overrides(model, *keys, "learner.micro_batch_size=4", "learner.micro_batch_tokens=0"))
    )
    want, m_padded = logprobs_and_step(padded)
    del padded
    torch.cuda.empty_cache()
    packed_keys = ["learner.micro_batch_tokens=2048", f"learner.packed_attention={attention}"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            packed = Learner(**learner_args(from_overrides(model, *keys, *packed_keys)))
    except (ConfigError, RuntimeError) as e:
        return {"refused": str(e), "kernel": varlen_kernel()}
    if packed.batcher.packed is None:  # the start-up check found mixed sequences: the learner trains padded
        return {"refused": " ".join(str(w.message) for w in caught), "kernel": varlen_kernel()}
    got, m_packed = logprobs_and_step(packed)

    def errors(lp: list[list[float]]) -> list[float]:
        return [abs(x - y) for a, b in zip(lp, ref) for x, y in zip(a, b)]

    e_packed, e_padded = errors(got), errors(want)
    max_adv = max(abs(s.advantage) for s in samples)
    return {
        "backend": packed.batcher.packed,
        "kernel": varlen_kernel(),
        "packed_vs_fp32": {"mean": sum(e_packed) / len(e_packed), "max": max(e_packed)},
        "padded_vs_fp32": {"mean": sum(e_padded) / len(e_padded), "max": max(e_padded)},
        "packed_vs_padded_max": max(abs(x - y) for a, b in zip(got, want) for x, y in zip(a, b)),
        "loss": [m_padded["train/loss"], m_packed["train/loss"]],
        # loss = -mean(A * ratio), ratio = exp(logp in the step - logp before it): both near 1, each off by how its
        # forward with gradients rounds against its own forward without
        "loss_tol": 1.5 * max_adv * (sum(e_packed) + sum(e_padded)) / len(e_packed),
        "grad_norm": [m_padded["train/grad_norm"], m_packed["train/grad_norm"]],
    }


def step_syncs(model: str, kind: str, tokens: int) -> dict:
    """Host waits for the GPU in one training step of four micro-batches (after a first step), counted by torch's
    sync debug mode, with where each happened and who asked for it. The step's one wait should be its metrics'
    transfer at the end: a wait between micro-batches drains the GPU's queue, which then idles while the CPU
    launches the next forward."""
    import random
    import traceback
    import warnings

    import torch

    from rl.app import learner_args
    from rl.learner import Learner
    from rl.types import TrainSample

    keys = [*COMMON, *LEARNER[kind], "learner.micro_batch_size=4", f"learner.micro_batch_tokens={tokens}"]
    learner = Learner(**learner_args(from_overrides(model, *keys)))
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 1000) for _ in range(n)]

    samples = [TrainSample(ids(32), ids(32), [-5.0] * 32, 1.0 if i % 2 else -1.0) for i in range(16)]
    learner.train_step(samples)
    torch.cuda.synchronize()
    where: list[str] = []
    callers: list[str] = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        # a wait is attributed to torch's own frame; who asked for it is the innermost frame outside torch
        stack = [f for f in traceback.extract_stack()[:-1] if "/warnings" not in f.filename]
        caller = next((f for f in reversed(stack) if "site-packages/torch/" not in f.filename), stack[-1])
        where.append(f"{filename}:{lineno}")
        callers.append(f"{caller.filename}:{caller.lineno} ({caller.name})")

    torch.cuda.set_sync_debug_mode("warn")  # torch reports this call itself as a wait: it is not recorded
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            metrics = learner.train_step(samples)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"syncs": len(where), "where": where, "callers": callers, "micro_batches": metrics["train/micro_batches"]}


def grouped_vs_alone(model: str, kind: str, samples_per_job: int = 64, steps: int = 2, per_forward: int = 1) -> dict:
    """A sweep pack's learner on the GPU (rl/learner/grouped.py): three jobs (lr 1e-4, 3e-4 and 0, seeds 0-2) of
    `samples_per_job` random-token samples each (prompts of 60-100 tokens, completions of 8-32, micro-batches of 32),
    stepped `steps` times three ways on three learners of `kind` built alike: in one grouped step (`grouped`), job
    after job with the model as built (`alone`: for Unsloth its fused LoRA kernels and compiled blocks, what a pack
    that does not group runs), and job after job with the LoRA layers' own forwards (`plain`: the grouped step's
    forwards, models.plain_lora_forwards). Per job: how far its adapter moved from the start, and how far the grouped
    one is from each solo one (mean absolute difference), its losses; the last step's seconds per way. `per_forward`:
    learner.pack_micro_batches (2: both of each job's micro-batches in one grouped forward)."""
    import random
    import time

    import torch

    from rl.app import learner_args
    from rl.learner import Learner
    from rl.learner.models import plain_lora_forwards
    from rl.runtime.packed import PackedRole
    from rl.types import JobError, TrainSample

    lrs = (1e-4, 3e-4, 0.0)
    keys = [k for k in COMMON if not k.startswith("algorithm.lr")] + LEARNER[kind] + ["learner.micro_batch_size=32"]
    keys.append(f"learner.pack_micro_batches={per_forward}")  # the solo steps ignore it
    jobs = [
        learner_args(from_overrides(model, *keys, f"algorithm.lr={lr}", f"run.seed={j}")) for j, lr in enumerate(lrs)
    ]
    roles = {way: PackedRole(Learner, jobs) for way in ("grouped", "alone", "plain")}
    assert plain_lora_forwards(roles["plain"].role.model) is None
    start = [{n: t.detach().float().clone() for n, t in state["tensors"].items()} for state in roles["alone"].states]
    rng = random.Random(0)

    def batch(job: int) -> list[TrainSample]:
        out = []
        for _ in range(samples_per_job // 8):  # groups of 8 completions of one prompt
            prompt = [rng.randrange(100, 20000) for _ in range(rng.randrange(60, 101))]
            for _ in range(8):
                n = rng.randrange(8, 33)
                out.append(TrainSample(prompt, [rng.randrange(100, 20000) for _ in range(n)], [], rng.gauss(0, 1)))
        logprobs = roles["plain"].on_job(
            job, "sequence_logprobs", [s.prompt_ids for s in out], [s.completion_ids for s in out]
        )
        for s, lp in zip(out, logprobs):
            s.old_logprobs = lp  # on-policy for all three ways: they start alike
        return out

    losses: dict[str, list] = {way: [] for way in roles}
    seconds: dict[str, float] = {}
    grouped_jobs: list[float] = []
    for _ in range(steps):
        batches = [batch(j) for j in range(len(lrs))]
        for way, role in roles.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if way == "grouped":
                metrics = [JobError.unwrap(m) for m in role.train_jobs([(j, (b,)) for j, b in enumerate(batches)])]
                grouped_jobs = [m["pack/grouped_jobs"] for m in metrics]
            else:
                metrics = [role.on_job(j, "train_step", b) for j, b in enumerate(batches)]
            torch.cuda.synchronize()
            seconds[way] = time.perf_counter() - t0
            losses[way].append([m["train/loss"] for m in metrics])

    def mean_diff(a: dict, b: dict) -> float:
        return sum(float((a[n].float() - b[n].float()).abs().sum()) for n in a) / sum(t.numel() for t in a.values())

    per_job = []
    for j in range(len(lrs)):
        got = roles["grouped"].states[j]["tensors"]
        per_job.append(
            {
                "lr": lrs[j],
                "moved": mean_diff(roles["alone"].states[j]["tensors"], start[j]),
                "grouped_vs_alone": mean_diff(got, roles["alone"].states[j]["tensors"]),
                "grouped_vs_plain": mean_diff(got, roles["plain"].states[j]["tensors"]),
                "grouped_moved": mean_diff(got, start[j]),
            }
        )
    return {"grouped_jobs": grouped_jobs, "seconds": seconds, "losses": losses, "jobs": per_job}


JOBS: dict[str, Any] = {
    "grouped_vs_alone": grouped_vs_alone,
    "learner": learner,
    "actor_vs_learner": actor_vs_learner,
    "packed_vs_padded": packed_vs_padded,
    "step_syncs": step_syncs,
    "quantized_mismatch": quantized_mismatch,
}

if __name__ == "__main__":  # vLLM may spawn processes
    name, args = sys.argv[1], json.loads(sys.argv[2])
    print("RESULT " + json.dumps(JOBS[name](**args)), flush=True)
