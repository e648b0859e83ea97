"""Checkpoints: atomic folders, keep_last, resume resolution, and exact round trips of every piece of state
(RNGs, data order, learner weights + optimizer, HF rollout sampling, metrics.jsonl trimming)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from rl.config.schema import CheckpointConfig, ConfigError, RunConfig, TrainConfig
from rl.loop import checkpoint
from rl.loop.driver import prompt_data
from rl.metrics import MetricsLogger
from rl.resolve import from_overrides
from rl.types import Adapter, Sampling
from tests.fakes import FakeLearner, fake_learner_state
from tests.helpers import make_learner, make_samples, metric_rows


def data_config(seed: int) -> TrainConfig:
    """Prompts of at most 10 tokens, without a chat template, in the order of run.seed=`seed`."""
    return from_overrides("/m", "model.max_prompt_tokens=10", "model.use_chat_template=false", f"run.seed={seed}")


def save_fake(run_dir, step: int, keep_last: int = 0):
    return checkpoint.save(
        run_dir,
        step,
        learner_state=fake_learner_state(step),
        trainer_state={"step": step, "data": {"cursor": 2 * step}},
        config={"steps": 9},
        keep_last=keep_last,
    )


def test_half_written_checkpoints_are_never_listed_and_keep_last_prunes(tmp_path):
    for step in (1, 2, 3):
        save_fake(tmp_path, step, keep_last=2)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [2, 3]
    # what a kill during a save leaves behind: a temp folder (even one holding every file) is not a checkpoint
    stale = tmp_path / "checkpoints" / ".step_0004.tmp"
    stale.mkdir()
    (stale / "trainer.pkl").write_bytes(b"\x80")
    assert checkpoint.latest(tmp_path).name == "step_0003"
    assert checkpoint.resolve_resume("auto", tmp_path).name == "step_0003"
    save_fake(tmp_path, 10, keep_last=2)  # sorted by step number, not by name; the stale temp folder is removed
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [3, 10]
    assert not stale.exists()
    trainer, learner = checkpoint.load(checkpoint.latest(tmp_path))
    assert trainer == {"step": 10, "data": {"cursor": 20}}
    assert learner["adapter"] == fake_learner_state(10)["adapter"] and learner["optimizer"] == b"opt"
    meta = json.loads((checkpoint.latest(tmp_path) / "meta.json").read_text())
    assert meta.pop("files") == {
        name: (checkpoint.latest(tmp_path) / name).stat().st_size for name in checkpoint.FILES
    }  # written last, the size of every other file: what makes the folder count as whole
    assert meta == {"step": 10, "adapter_version": 10, "data_cursor": 20}


def test_resume_resolution(tmp_path):
    assert checkpoint.resolve_resume(None, tmp_path) is None
    assert checkpoint.resolve_resume("auto", tmp_path) is None  # nothing yet: start fresh
    with pytest.raises(ConfigError, match="run.resume=.*not a checkpoint folder"):
        checkpoint.resolve_resume(str(tmp_path), tmp_path)
    path = save_fake(tmp_path, 5)
    assert checkpoint.resolve_resume(str(path), tmp_path) == path


def test_a_finished_run_is_not_started_again_by_a_resume(tmp_path):
    """run.resume=auto on a run that trained its run.steps and wrote its summary: nothing left (its summary comes
    back untouched); with more steps, or without the summary (stopped before the final evaluation), it resumes."""
    save_fake(tmp_path, 4)
    assert checkpoint.finished_summary("auto", tmp_path, 4) is None  # no summary: the final evaluation is missing
    (tmp_path / checkpoint.SUMMARY).write_text(json.dumps({"eval/accuracy_after": 0.5}))
    assert checkpoint.finished_summary("auto", tmp_path, 4) == {"eval/accuracy_after": 0.5}
    assert checkpoint.finished_summary("auto", tmp_path, 6) is None
    assert checkpoint.finished_summary(None, tmp_path, 4) is None


def test_config_keys_are_validated():
    with pytest.raises(ConfigError, match="run.resume=auto .* set run.output_dir"):
        RunConfig(resume="auto")
    with pytest.raises(ConfigError, match="checkpoint.interval must be >= 0"):
        CheckpointConfig(interval=-1)
    with pytest.raises(ConfigError, match="checkpoint.keep_last must be >= 0"):
        CheckpointConfig(keep_last=-2)
    assert TrainConfig(run=RunConfig(resume="auto", output_dir="/tmp/x")).run.resume == "auto"


def test_rng_states_round_trip():
    state = checkpoint.rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    checkpoint.set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


class CharTokenizer:
    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}


def test_data_order_and_cursor_round_trip():
    items = [{"messages": [{"role": "user", "content": f"q{i}"}], "answer": str(i)} for i in range(5)]

    def data():
        return prompt_data(items, CharTokenizer(), data_config(3))

    a = data()
    a.next_batch(3)  # mid-pass: the rest of the current shuffled pass must survive
    state = a.state_dict()
    expected = [a.next_batch(3) for _ in range(4)]
    b = data()
    b.load_state(state)
    assert b.cursor == 3
    assert [b.next_batch(3) for _ in range(4)] == expected
    with pytest.raises(ConfigError, match="5 training prompts, this run has 4"):
        prompt_data(items[:4], CharTokenizer(), data_config(3)).load_state(state)


def test_learner_state_round_trip_is_exact(tiny_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    a = make_learner(tiny_model)
    a.train_step(make_samples(seed=1))
    checkpoint.save(tmp_path, 1, learner_state=a.state_dict(), trainer_state={"step": 1})
    _, state = checkpoint.load(checkpoint.latest(tmp_path))
    b = make_learner(tiny_model)  # a fresh optimizer and other LoRA weights: everything must come from `state`
    with torch.no_grad():
        for p in b.model.parameters():
            if p.requires_grad:
                p.add_(0.01)
    b.load_state(state)
    assert b.version == a.version == 1
    batch = make_samples(seed=2)
    ma, mb = a.train_step(batch), b.train_step(batch)  # AdamW's moments matter here: a fresh optimizer differs
    assert ma["train/loss"] == mb["train/loss"] and ma["train/grad_norm"] == mb["train/grad_norm"]
    wa, wb = (x.model.state_dict() for x in (a, b))
    lora = [k for k in wa if "lora_" in k]
    assert lora and all(torch.equal(wa[k], wb[k]) for k in lora)
    # the checkpoint's adapter folder is a PEFT adapter
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, str(checkpoint.latest(tmp_path) / "adapter"))
    assert any("lora_A" in k for k in peft.state_dict())


def test_hf_rollout_sampling_resumes_exactly(tiny_model):
    from rl.app import rollout_args
    from rl.rollout.hf import HFRollout

    rollout = HFRollout(
        **rollout_args(from_overrides(str(tiny_model), "cluster.rollout_backend=hf", "model.dtype=float32"))
    )
    prompts, sampling = [[1, 2, 3, 4]], Sampling(n=3, temperature=1.0, max_tokens=6)
    state = rollout.state_dict()
    first = [c.token_ids for c in rollout.generate(prompts, sampling)[0].completions]
    rollout.generate(prompts, sampling)  # move the generator on
    rollout.load_state(state)
    assert [c.token_ids for c in rollout.generate(prompts, sampling)[0].completions] == first


def test_metrics_rows_after_the_checkpoint_are_dropped(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in range(4):
        logger.log(step, {"reward/mean": float(step)})
    logger.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "rew')  # cut by a kill
    logger = MetricsLogger(tmp_path)
    assert logger.drop_after(2) == 2
    logger.log(3, {"reward/mean": 30.0})
    logger.close()
    rows = metric_rows(tmp_path, timings=True)
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]
    logger = MetricsLogger(tmp_path)  # a resumed run reads its evaluation before training back
    logger.log(0, {"eval/accuracy": 0.25})
    assert logger.value_at(0, "eval/accuracy") == 0.25 and logger.value_at(1, "eval/accuracy") is None
    logger.close()


class EngineWithoutRngState:
    """Like VLLMRollout: loads adapters; its state is empty (no sample depends on its sampler's RNG)."""

    def __init__(self):
        self.version, self.loaded_states = 0, []

    def load_adapter(self, adapter: Adapter) -> dict:
        self.version = adapter.version
        return {"seconds": 0.0, "bytes": adapter.nbytes}

    def state_dict(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        self.loaded_states.append(state)


def test_restore_run_pushes_the_adapter_and_hands_each_engine_its_state(tmp_path):
    from rl.runtime.groups import LocalGroup
    from rl.runtime.runtime import Runtime

    items = [{"messages": [{"role": "user", "content": f"q{i}"}], "answer": str(i)} for i in range(4)]
    cfg = data_config(0)
    data = prompt_data(items, CharTokenizer(), cfg)
    data.next_batch(3)
    runtime = Runtime(LocalGroup([EngineWithoutRngState()]), LocalGroup([FakeLearner(version=7)]), cfg.cluster)
    path = checkpoint.save_run(tmp_path, 7, runtime, data, config={"seed": 0})
    assert checkpoint.load(path)[0]["rollout"] == [{}]  # nothing to save for such an engine
    assert json.loads((path / "config.json").read_text()) == {"seed": 0}

    actor, learner = EngineWithoutRngState(), FakeLearner()
    fresh = Runtime(LocalGroup([actor]), LocalGroup([learner]), cfg.cluster)
    data2 = prompt_data(items, CharTokenizer(), cfg)
    assert checkpoint.restore_run(path, fresh, data2) == 7
    assert learner.loaded["adapter"].version == 7 and actor.version == fresh.version == 7  # versions continue
    assert actor.loaded_states == [{}]
    assert data2.cursor == 3 and data2.next_batch(2) == data.next_batch(2)
