"""Test-only building blocks: a tiny random model with the real SmolLM2 tokenizer, simple rewards, the environment
a child process that imports the repo needs, configs composed as a run composes them, and checks of finished runs.
The benchmark scripts use some of them too (the tiny model, the child environment); nothing here imports bench/."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"

# config.json fields of Qwen/Qwen2.5-0.5B-Instruct (written by hand from the hub file): a real shape for the memory
# plan and the start-up diagnosis, without the weights
QWEN_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def repo_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that imports the repo: the repo first on PYTHONPATH, the caller's
    entries kept behind it (packages installed with `pip --target`, as on the GPU machine), plus `extra`."""
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=pythonpath, **extra)


def build_tiny_model(out: Path, seed: int = 0) -> Path:
    """A 2-layer random Llama (head_dim 64, as vLLM's CPU attention wants) with SmolLM2's tokenizer and chat
    template, saved as an ordinary HF folder. About 7M parameters, most of them the 49152-token embedding."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rl.model_path import embedded_gguf

    if (out / "config.json").is_file():
        return out
    gguf = embedded_gguf("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.bos_token, tok.eos_token, tok.pad_token = "<|im_start|>", "<|im_end|>", "<|im_end|>"
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


class LengthReward:
    """Reward = number of characters / 100, capped at 1: varies between samples of a random model, so the
    advantages (and the LoRA gradient) are not zero."""

    def __init__(self, scale: float = 100.0):
        self.scale = scale  # characters for reward 1 (raise it for long random completions, e.g. on a GPU)

    def __call__(self, completions, *, answer, **kwargs):
        return [min(len(c) / self.scale, 1.0) for c in completions]


class ConstantReward:
    """Reward `value` for every completion: a group's advantages are all zero, so the loss has no gradient and the
    adapter stays as it started (a sweep pack's check that a job trains on its own samples only)."""

    def __init__(self, value: float = 0.5):
        self.value = value

    def __call__(self, completions, *, answer, **kwargs):
        return [self.value] * len(completions)


class RaisingReward:
    """A reward whose own code fails: the job's error is one line of the sweep and the other jobs go on."""

    def __call__(self, completions, *, answer, **kwargs):
        raise RuntimeError("this reward always fails")


class NanReward:
    """Reward NaN for every completion: the loss is non-finite and the step is skipped (with
    run.max_nonfinite_steps=1 the run stops after its first step)."""

    def __call__(self, completions, *, answer, **kwargs):
        return [float("nan")] * len(completions)


# the length reward in place of the default one: the default's reward-runner keys (workers, timeout_s, the wrapped
# reward) are dropped, since the length reward is a plain `_target_` scored in the driver
LENGTH_REWARD = ["reward._target_=tests.helpers.LengthReward", "~reward.workers", "~reward.timeout_s", "~reward.reward"]


def tiny_args(model: Path, *, in_process: bool = True) -> list[str]:
    """train.py overrides every tiny end-to-end test shares: the tiny model in fp32, the length reward (its samples
    differ, so advantages are not zero) and, with `in_process`, one process with HF generation (no Ray, no vLLM)."""
    args = [
        f"model.path={model}",
        "model.dtype=float32",
        "model.learner_dtype=float32",
        *LENGTH_REWARD,
    ]
    return args + (["cluster=local", "cluster.rollout_backend=hf"] if in_process else [])


# a two-step run's overrides (2 prompts x 4 samples of 16 tokens, 4 eval prompts, the length reward, fp32); with
# check_trained, the end-to-end tests' common check that training happened and the actor followed the learner
TINY_RUN = [
    "run.steps=2",
    "run.prompts_per_step=2",
    "algorithm.group_size=4",
    "eval.size=4",
    "model.max_new_tokens=16",
    "learner.micro_batch_size=8",
    *LENGTH_REWARD,
    "model.dtype=float32",
    "model.learner_dtype=float32",
    "run.sync_probe_threshold=0.01",
]


def check_trained(run_dir: Path) -> list[dict]:
    """A TINY_RUN in `run_dir` trained: two steps, the second sampled with the adapter published after the first,
    the actor's logprobs the learner's on the probe, the saved adapter changed. The steps' rows."""
    from safetensors.torch import load_file

    rows = metric_rows(run_dir, timings=True)
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # step 1 samples came from the base model (version 0), step 2 from the adapter published after step 1
    assert [r["actor/adapter_version"] for r in steps] == [0.0, 1.0]
    assert [r["sync/version"] for r in steps] == [1.0, 2.0]
    # the actor runs the learner's adapter: learner and actor logprobs agree on the probe
    assert all(r["sync/logprob_abs_diff"] < 0.01 for r in steps)
    # the adapter changed: PEFT initialises lora_B to zero, training made it non-zero
    weights = load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
    lora_b = [t for k, t in weights.items() if "lora_B" in k]
    assert lora_b and any(float(t.abs().max()) > 0 for t in lora_b)
    assert json.loads((run_dir / "adapter" / "adapter_config.json").read_text())["r"] == 16
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "eval/accuracy_before" in summary and "eval/accuracy_after" in summary
    return steps


def make_samples(groups: int = 3, group_size: int = 4, seed: int = 0, old_logprob: float = -2.0) -> list:
    """Random TrainSamples: `groups` prompts of 5-11 tokens, `group_size` completions of 2-8 tokens each."""
    import random

    from rl.types import TrainSample

    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        prompt = [rng.randrange(10, 4000) for _ in range(rng.randrange(5, 12))]
        for _ in range(group_size):
            n = rng.randrange(2, 9)
            out.append(
                TrainSample(prompt, [rng.randrange(10, 4000) for _ in range(n)], [old_logprob] * n, rng.gauss(0, 1))
            )
    return out


def typed_config(**dotted):
    """A checked TrainConfig from dotted keys (`**{"cluster.use_gpu": True}`), as the config loads at start: the
    cross-field checks run, so a bad combination raises ConfigError."""
    from omegaconf import OmegaConf

    from rl.config.schema import TrainConfig

    dotlist = [f"{k}={v}" for k, v in dotted.items()]
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(dotlist)))


def actor_engine_kwargs(cfg) -> dict:
    """vLLM `LLM(...)` arguments of a rollout actor of the resolved `cfg` (rl/rollout/vllm.py engine_kwargs)."""
    from rl.rollout.vllm import engine_kwargs

    return engine_kwargs(cfg.model, cfg.cluster, max_seq_length=cfg.max_seq_length, seed=cfg.run.seed)


def env_and_reward(*overrides: str):
    """The env and the reward conf/train.yaml builds with these overrides (and eval.size=8), as a run builds them."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rl.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["eval.size=8", *overrides])
    return instantiate(cfg.env, _convert_="all"), instantiate(cfg.reward, _convert_="all")


def run_train(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run train.py as a user would; returns the finished process (stdout and stderr captured)."""
    env = repo_env(HYDRA_FULL_ERROR="0")
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@functools.cache
def _scratch() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="rlft-tests-")  # removed when the test process exits


def scratch_run_dir() -> Path:
    """A fresh run directory for a config resolved outside a run: roles write their logs under it, so it must be writable
    and must not be shared with another test."""
    return Path(tempfile.mkdtemp(prefix="run-", dir=_scratch().name))


def run_spec(model: Path | str, *overrides: str, run_dir: Path | str | None = None):
    """The resolved config train.py builds with these overrides, with `model` as the resolved model path."""
    from rl.resolve import from_overrides

    return from_overrides(str(model), *overrides, run_dir=run_dir or scratch_run_dir())


LEARNER_TEST_OVERRIDES = (  # a small fp32 LoRA learner without the KL term, at lr 1e-4
    "model.dtype=float32",
    "model.learner_dtype=float32",
    "model.lora_targets=[q_proj,v_proj,up_proj]",
    "cluster.learner_threads=1",
    "algorithm.kl_coef=0",
    "algorithm.lr=1e-4",
)


def make_learner(model: Path | str, *overrides: str):
    """A Learner on `model` (fp32, LoRA on q/v/up, one thread) built from its config as a run builds it, with config
    overrides; its lora_B starts random (PEFT starts it at zero) so that the adapter changes logprobs."""
    import torch

    from rl.app import learner_args
    from rl.learner import Learner

    learner = Learner(**learner_args(run_spec(model, *LEARNER_TEST_OVERRIDES, *overrides)))
    gen = torch.Generator().manual_seed(1)
    for name, p in learner.model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero; give the adapter an effect so the test is not trivial
            p.data.normal_(0, 0.05, generator=gen)
    return learner


def sigkill_self_once(marker: str) -> None:
    """SIGKILL this process, unless `marker` exists: it is created first, exclusively, holding the pid, so the first
    process to get here dies and a restarted one (or a second actor) goes on."""
    import signal

    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


# --- comparing two runs: metrics without durations, adapters by checksum, rollout and evaluation dumps -------------

TIMING = ("time/", "perf/", "sync/actor_load_s")  # durations differ between any two runs
PACKING = ("pack/",)  # how a sweep pack grouped a job's step: a fact of the pack, not of the job


def metric_rows(run_dir: Path, *, timings: bool = False) -> list[dict]:
    """metrics.jsonl's rows, without the durations and the pack's grouping unless `timings`."""
    out = jsonl(run_dir / "metrics.jsonl")
    return out if timings else [{k: v for k, v in r.items() if not k.startswith(TIMING + PACKING)} for r in out]


def sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def jsonl(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same_first_steps(a: Path, b: Path, steps: int = 2) -> None:
    """Run `a` (more steps) and run `b` (`steps` steps, then maybe resumed) agree up to `steps`: metrics, each
    step's checkpointed adapter and rollout dump (`checkpoint.interval=1`, `logger.rollouts_interval=1`), and the
    evaluation before training; and the groups' samples differed (the comparison is not vacuous)."""

    # b's rows up to `steps` are its first part's (a resume keeps them), less the evaluation that ended it (and a's
    # too when a also stopped there)
    def first_part(run: Path) -> list[dict]:
        return [r for r in metric_rows(run) if r["step"] <= steps and not (r["step"] == steps and "eval/n" in r)]

    early, rows_a = first_part(b), first_part(a)
    assert rows_a == early, [(x, y) for x, y in zip(rows_a, early) if x != y][:2] or (len(rows_a), len(early))
    assert len([r for r in early if "train/loss" in r]) == steps
    assert any(r.get("reward/std", 0) > 0 for r in early)
    for step in range(1, steps + 1):
        ckpt = f"checkpoints/step_{step:04d}/adapter/adapter_model.safetensors"
        assert sha256(a / ckpt) == sha256(b / ckpt), f"adapters differ at step {step}"
        dump = f"rollouts/step_{step:04d}.jsonl"
        assert jsonl(a / dump) == jsonl(b / dump), f"rollouts differ at step {step}"
    assert jsonl(a / "eval" / "step_0000.jsonl") == jsonl(b / "eval" / "step_0000.jsonl")


def assert_resume_matches(a: Path, b: Path, resumed_stdout: str, steps: int, prompts_per_step: int) -> None:
    """Run `b`, stopped after `steps - 1` and resumed (`run.resume=auto`, staleness 0) to `steps`, equals the
    uninterrupted run `a`: training rows, the final evaluation, adapter, rollout and evaluation dumps."""
    k = steps - 1
    assert "resumed from" in resumed_stdout
    assert f"step {k}, adapter version {k}, data cursor {k * prompts_per_step}" in resumed_stdout
    train_a = [r for r in metric_rows(a) if "train/loss" in r]
    train_b = [r for r in metric_rows(b) if "train/loss" in r]
    assert [r["step"] for r in train_b] == list(range(1, steps + 1)) and train_b == train_a
    assert train_b[-1]["actor/adapter_version"] == k and train_b[-1]["sync/version"] == steps
    final = [r for r in metric_rows(a) if "eval/accuracy" in r and r["step"] == steps]
    assert final == [r for r in metric_rows(b) if "eval/accuracy" in r and r["step"] == steps]
    assert sha256(a / "adapter" / "adapter_model.safetensors") == sha256(b / "adapter" / "adapter_model.safetensors")
    last = f"step_{steps:04d}.jsonl"
    assert jsonl(a / "rollouts" / last) == jsonl(b / "rollouts" / last)
    assert jsonl(a / "eval" / last) == jsonl(b / "eval" / last)


def assert_continuous_run(out: Path, steps: int, bound: int, samples_per_step: int) -> list[dict]:
    """A `cluster.rollout_mode=continuous` run in `out` (`logger.rollouts_interval=1`) trained `steps` steps of
    `samples_per_step` samples, none older than `bound` syncs (metrics and each dumped sample's per-token versions),
    and some samples continued across an adapter update (two versions in one sample), as many as
    async/partial_rollouts counted. The steps' rows."""
    rows = [r for r in metric_rows(out, timings=True) if "reward/mean" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["async/staleness_max"] <= bound for r in rows)
    assert all(sum(r[f"async/lag_{k}"] for k in range(bound + 1)) == samples_per_step for r in rows)
    assert sum(r["async/segments_continued"] for r in rows) > 0
    assert all(r["perf/samples_per_s"] > 0 and 0 <= r["perf/actor_idle_frac"] <= 1 for r in rows)
    spanning = 0
    for r in rows:
        current = r["sync/version"] - 1  # the version the learner trained this step from
        for row in jsonl(out / "rollouts" / f"step_{r['step']:04d}.jsonl"):
            versions = [span["version"] for span in row["versions"]]
            assert current - min(versions) <= bound
            spanning += len(set(versions)) > 1
    partial = [r["async/partial_rollouts"] for r in rows]
    assert spanning > 0 and spanning == sum(partial), f"{spanning} samples span two versions; metrics: {partial}"
    return rows
