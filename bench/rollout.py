"""Rollout throughput: our vLLM actor (rl.rollout.VLLMRollout, as the framework uses it) against HF `generate` and
plain vLLM on the same model, prompts, sampling and lengths; each side in its own fresh process, one after the other.

CPU (about 4 min here):  python -m bench.rollout
CUDA (random Qwen2.5-0.5B shape, no hub needed):  python -m bench.rollout --device cuda --shape qwen2.5-0.5b \
    --prompts 64 --n 8 --max-tokens 256

Ours: one `generate` call with the whole step's prompts (the driver passes all prompts of a step at once; vLLM
batches them continuously), each prompt with its own seed as a run's sampler sends it (rl/seeds.py), with a rank-16
adapter loaded the way the framework loads it (`--lora-mode auto` picks what `cluster.lora_mode=auto` does),
sampled-token logprobs returned, as training needs them. Raw vLLM: `LLM` with the same engine settings and
`SamplingParams` without logprobs, on the base weights (what a merged adapter costs); `raw_same`: the same with our
actor's SamplingParams (sampled-token logprobs, no detokenisation); `raw_engine`: that, on an engine built with our
actor's own engine arguments (rl/rollout/vllm.py `engine_kwargs`: processed logprobs, the worker extension), so that
raw_same -> raw_engine is what our engine settings cost and raw_engine -> ours what VLLMRollout adds around the
engine.
HF: `model.generate` on all prompts x n in one left-padded batch (the strongest plain-HF setting; rows that
finish early still ride along until the longest finishes), on the base weights. Same temperature 1 sampling,
top_p 1, no top-k, max_tokens. Tokens/s counts generated tokens up to and including EOS on every side.
`--diagnose` adds timings on our engine driven with other SamplingParams (vLLM's own detokenisation and per-token
logprob dicts; no logprobs; no seeds: vLLM draws each seeded request's noise with its own generator, a request at a
time, so `ours_unseeded` and `no_logprobs_seeded` show what the seeds cost), to split our overhead over raw vLLM.
Every number is a median of `--repeats` timed calls (x `--rounds` fresh processes per side) shown with its min-max
spread; a ratio of medians comes with the range the two spreads allow (one run's ratio has moved 0.77x -> 0.87x between
runs on the H200).
Prints JSON lines and a markdown row; `--rows FILE` summarises the rows a run printed (a GPU call's run cut by its
time limit keeps the processes it finished).

Past 400 lines because it is one tool a GPU call runs whole: the five sides' timed engines, the `--diagnose`
variants, and the comparison that pools each side's processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench.common import (
    add_model_args,
    append_result,
    demo_prompts,
    machine,
    machine_label,
    median,
    model_path,
    random_adapters,
    run_side_process,
    set_threads,
    show_spread,
    spread,
    timed_generation,
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

    run(len(prompts))  # warm-up at the timed size
    rates, toks = [], []
    for _ in range(args.repeats):
        n_tok, dt = run(len(prompts))
        rates.append(n_tok / dt)
        toks.append(n_tok)
    return {"side": "hf_generate", "tokens_per_s": round(median(rates), 1), "tokens": toks, "rates": rates}


def engine_kwargs(path: str, prompts: list[list[int]], args) -> dict:
    """The vLLM engine settings both vLLM sides share."""
    return dict(
        dtype=args.dtype,
        max_model_len=max(len(p) for p in prompts) + args.max_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.device == "cpu",
    )


def run_seeds(n: int) -> list[int]:
    """A seed per prompt, as a run's sampler sends its step's prompts (rl/seeds.py; run seed 0, step 1)."""
    from rl.seeds import prompt_seed

    return [prompt_seed(0, i, "train", 1) for i in range(n)]


def seeded_generate(rollout):
    """Our actor's generate(prompts, Sampling) as a run's sampler calls it: each prompt with its run_seeds seed."""
    return lambda ps, s: rollout.generate(ps, s, run_seeds(len(ps)))


def plain_generate(llm, lora_request=None, seeded: bool = False, **extra):
    """A generate(prompts, Sampling) function that drives a vLLM `LLM` directly with `SamplingParams(**extra)` (with
    `seeded`, one per prompt with its run_seeds seed), its outputs shaped for `timed_generation` (`.completions` with
    `.token_ids`)."""
    from types import SimpleNamespace

    from vllm import SamplingParams

    def generate(ps, s):
        def params(seed=None):
            keys = dict(n=s.n, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=seed)
            return SamplingParams(**keys, **extra)

        per = [params(seed) for seed in run_seeds(len(ps))] if seeded else params()
        outs = llm.generate([{"prompt_token_ids": p} for p in ps], per, lora_request=lora_request, use_tqdm=False)
        return [SimpleNamespace(completions=o.outputs) for o in outs]

    return generate


def raw_vllm_rate(path: str, prompts: list[list[int]], args, side: str) -> dict:
    """Generated tokens/s of plain vLLM, base weights. `raw`: `LLM` + `SamplingParams` without logprobs;
    `raw_same`: the SamplingParams our actor sends (sampled-token logprobs, flat where this vLLM has them, no
    detokenisation), so that the ratio to ours is our wrapper's cost alone; `raw_engine`: those, on the engine
    built from our actor's engine arguments instead of the bench's."""
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    if side == "raw_engine":
        from rl.rollout.vllm import engine_kwargs as actor_engine_kwargs

        cfg = our_config(path, prompts, args)
        llm = LLM(**actor_engine_kwargs(cfg.model, cfg.cluster, max_seq_length=cfg.max_seq_length, seed=cfg.run.seed))
    else:
        llm = LLM(model=path, seed=0, **engine_kwargs(path, prompts, args))
    start_s = time.perf_counter() - t0
    extra = {}
    if side != "raw":
        extra = {"logprobs": 0, "detokenize": False}
        if "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ()):
            extra["flat_logprobs"] = True
    rates, toks = timed_generations(plain_generate(llm, **extra), prompts, sampling_of(args), args.repeats)
    return {
        "side": SIDES[side],
        "tokens_per_s": round(median(rates), 1),
        "tokens": toks,
        "rates": rates,
        "engine_start_s": round(start_s, 1),
    }


def sampling_of(args):
    from rl.types import Sampling

    return Sampling(n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.max_tokens)


def our_config(path: str, prompts: list[list[int]], args):
    """The resolved config our actor takes on the bench's engine settings, as a run resolves it (cluster.lora_mode
    auto resolved)."""
    from rl.resolve import from_overrides

    e = engine_kwargs(path, prompts, args)
    keys = [
        f"cluster.lora_mode={args.lora_mode}",
        f"cluster.use_gpu={args.device == 'cuda'}",
        f"cluster.gpu_memory_utilization={e['gpu_memory_utilization']}",
        f"cluster.enforce_eager={e['enforce_eager']}",
        f"model.dtype={e['dtype']}",
        f"model.max_prompt_tokens={e['max_model_len'] - args.max_tokens}",
        f"model.max_new_tokens={args.max_tokens}",
    ]
    return from_overrides(path, *keys)


def ours_rate(path: str, prompts: list[list[int]], args) -> dict:
    """Generated tokens/s of our actor: one generate call with every prompt of the step."""
    from rl.app import rollout_args
    from rl.rollout.vllm import VLLMRollout

    cfg = our_config(path, prompts, args)
    lora_mode = cfg.cluster.lora_mode.value
    adapter = random_adapters(path, threads=args.threads)[0]
    t0 = time.perf_counter()
    r = VLLMRollout(**rollout_args(cfg))
    start_s = time.perf_counter() - t0
    load_s = [r.load_adapter(adapter)["seconds"]]
    for v in range(2, 4):  # later versions: what each training step pays (the first also reads the base)
        adapter.version = v
        load_s.append(r.load_adapter(adapter)["seconds"])
    sampling = sampling_of(args)
    rates, toks = timed_generations(seeded_generate(r), prompts, sampling, args.repeats)
    row = {
        "side": f"ours_vllm_{lora_mode}",
        "tokens_per_s": round(median(rates), 1),
        "tokens": toks,
        "rates": rates,
        "engine_start_s": round(start_s, 1),
        "adapter_load_s": [round(x, 3) for x in load_s],
    }
    if args.diagnose:
        row["diagnose"] = diagnose(r, prompts, sampling, args)
    r.close()
    return row


def diagnose(r, prompts: list[list[int]], sampling, args) -> dict:
    """Tokens/s of our engine (adapter loaded) driven directly: which part of our path costs what."""

    def direct(seeded: bool = False, **extra):
        return plain_generate(r.llm, r._lora_request, seeded, **extra)

    variants = {
        "ours": seeded_generate(r),
        "ours_unseeded": r.generate,
        "engine_detokenize_dict_logprobs": direct(logprobs=0),  # vLLM detokenises and builds per-token logprob dicts
        "no_logprobs": direct(),  # raw vLLM's SamplingParams, on our engine and adapter
        "no_logprobs_seeded": direct(seeded=True),
        "no_logprobs_no_detokenize": direct(detokenize=False),
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for gen in variants.values():
        gen(prompts, sampling)  # warm-up
    for _ in range(args.repeats):  # interleaved, so that drift in the machine's speed hits every variant alike
        for name, gen in variants.items():
            rates[name].append(timed_generation(gen, prompts, sampling)[0])
    return {name: round(median(rs), 1) for name, rs in rates.items()}


SIDES = {
    "hf": "hf_generate",
    "raw": "raw_vllm",
    "raw_same": "raw_vllm_same_params",
    "raw_engine": "raw_vllm_our_engine",
    "ours": "ours",
}


def run_side(args) -> dict:
    """This process runs one side (called by `compare` in a fresh process)."""
    if args.device == "cuda":
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # vLLM 0.26 on the GPU machine (FACTS.md)
    else:
        from rl.rollout.vllm import cpu_threads_env

        os.environ.update(cpu_threads_env(args.threads))
    from transformers import AutoTokenizer

    path = model_path(args)
    prompts = demo_prompts(AutoTokenizer.from_pretrained(path), args.prompts)
    before = machine()
    if args.side == "hf":
        row = hf_generate_rate(path, prompts, args)
    elif args.side in ("raw", "raw_same", "raw_engine"):
        row = raw_vllm_rate(path, prompts, args, args.side)
    else:
        row = ours_rate(path, prompts, args)
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
    return {"bench": "rollout", **work, **row, "machine": info}


def compare(args) -> None:
    """Each side in a fresh process (two vLLM engines do not share one process cleanly), `--rounds` times in turns
    (hf, raw, ours, hf, ...) so that a change in the machine's load hits every side alike; every side's timed
    calls pooled into a median and a spread; ratios of the medians with the range the spreads allow, and the same
    ratio within each round (each side's median in that round's process): on the H200 two processes of one side have
    differed by more than the sides do, which the pooled ratio alone hides. With `--rows FILE`, no process runs: the
    rows a run printed (one cut by its call's time limit included) are summarised as that run would have."""
    sides = args.sides.split(",")
    for side in sides:
        if side not in SIDES:
            raise SystemExit(f"--sides: unknown side {side!r} (choose from {', '.join(SIDES)})")
    if args.rows:
        return summarize(printed_rows(args.rows), args)
    ran = []
    for _ in range(args.rounds):
        for side in sides:
            row = run_side_process("bench.rollout", side, sys.argv[1:])
            print(json.dumps(row), flush=True)
            ran.append((side, row))
    summarize(ran, args)


def printed_rows(path: str) -> list[tuple[str, dict]]:
    """The per-process rows a run of this bench printed to `path` (its output, other lines skipped), each with the
    side it ran, in the order they ran."""
    named = {row_side: side for side, row_side in SIDES.items()}  # ours' rows name their LoRA mode: ours_vllm_<mode>
    ran = []
    for line in Path(path).read_text().splitlines():
        row = json.loads(line) if line.startswith('{"bench": "rollout"') else {}
        if "rates" in row:
            ran.append(("ours" if row["side"].startswith("ours") else named[row["side"]], row))
    if not ran:
        raise SystemExit(f"--rows {path}: no row of bench.rollout's sides in it")
    return ran


def summarize(ran: list[tuple[str, dict]], args) -> None:
    """Pool each side's processes (`ran`: side and row, in the order they ran), print the ratios and the markdown
    row, and append the result; a round cut short gives the sides it holds no per-round ratio."""
    rows: dict[str, dict] = {}
    process_medians: dict[str, list[float]] = {}
    for side, row in ran:
        process_medians.setdefault(side, []).append(median(row["rates"]))
        if side in rows:
            rows[side]["rates"] = rows[side]["rates"] + row["rates"]
        else:
            rows[side] = dict(row)
    for row in rows.values():
        row["spread"] = spread(row["rates"])
        row["tokens_per_s"] = round(row["spread"]["median"], 1)
    rate = {side: row["tokens_per_s"] for side, row in rows.items()}
    sp = {side: row["spread"] for side, row in rows.items()}
    pairs = [
        ("ours", "hf"),
        ("ours", "raw"),
        ("ours", "raw_same"),
        ("raw_engine", "raw_same"),  # what our engine arguments cost
        ("ours", "raw_engine"),  # what VLLMRollout adds around the engine
        ("raw", "hf"),
    ]
    ratios, bounds, per_round = {}, {}, {}
    for a, b in pairs:
        if a in rate and b in rate:
            ratios[f"{a}_over_{b}"] = round(rate[a] / rate[b], 2)
            bounds[f"{a}_over_{b}"] = [round(sp[a]["min"] / sp[b]["max"], 2), round(sp[a]["max"] / sp[b]["min"], 2)]
            per_round[f"{a}_over_{b}"] = [round(x / y, 2) for x, y in zip(process_medians[a], process_medians[b])]
    print(
        json.dumps({"bench": "rollout", "ratios": ratios, "ratio_bounds": bounds, "ratio_per_round": per_round}),
        flush=True,
    )
    first = next(iter(rows.values()))
    counts = {side: len(medians) for side, medians in process_medians.items()}
    summary = {"tokens_per_s": rate, "ratios": ratios, "ratio_bounds": bounds, "ratio_per_round": per_round}
    summary["processes"] = counts
    append_result("rollout", summary | {"sides": rows}, info=first["machine"])
    names = {
        "hf": "HF generate",
        "raw": "raw vLLM",
        "raw_same": "raw vLLM with our SamplingParams",
        "raw_engine": "raw vLLM with our SamplingParams and engine arguments",
    }
    if "ours" in rows:
        names["ours"] = f"ours (vLLM, {rows['ours']['side'].rsplit('_', 1)[1]} LoRA)"
    cells = [f"{names[side]} {show_spread(sp[side], ' tok/s')}" for side in rows]
    shown = ", ".join(
        f"{k} {v:.2f}x ({bounds[k][0]:.2f}-{bounds[k][1]:.2f}"
        + (f"; per round {', '.join(f'{x:.2f}' for x in per_round[k])})" if len(per_round[k]) > 1 else ")")
        for k, v in ratios.items()
    )
    print(
        f"| rollout: {first['model']}, {args.prompts} prompts x {args.n}, {args.max_tokens} new tokens, {args.dtype}; "
        f"median (min-max) of {args.repeats} calls x {'/'.join(map(str, counts.values()))} process(es) per side "
        f"| {'; '.join(cells)} | {f'**{shown}**' if shown else 'one side: no ratio'} | "
        f"{machine_label(first['machine'])} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (demo: 8)")
    ap.add_argument("--n", type=int, default=8, help="completions per prompt (demo: group_size 8)")
    ap.add_argument("--max-tokens", type=int, default=32, help="max new tokens (demo: 32)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=3, help="timed generate calls per side and process")
    ap.add_argument("--rounds", type=int, default=1, help="fresh processes per side, in turns (repeats pooled)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    ap.add_argument("--lora-mode", choices=["auto", "native", "merged"], default="auto", help="our actor's LoRA mode")
    ap.add_argument("--sides", default="hf,raw,ours", help="which sides to run, each in a fresh process")
    ap.add_argument("--side", choices=list(SIDES), default=None, help="run one side in this process")
    ap.add_argument("--diagnose", action="store_true", help="ours: also time plain SamplingParams on our engine")
    ap.add_argument("--rows", default=None, help="summarise the rows a run printed to this file (none is run)")
    args = ap.parse_args()
    if args.side is None:
        return compare(args)
    print(json.dumps(run_side(args)), flush=True)


if __name__ == "__main__":
    main()
