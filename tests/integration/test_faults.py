"""Asynchronous rollouts and faults on a real local Ray: a rollout actor killed with SIGKILL in the middle of a
run (staleness 1, two actors) is restarted by Ray, its prompts go to the other actor, every prompt of every step
is trained exactly once and the log says what happened; one whose restart raises in __init__ is left out at once
and the other actor finishes the run; a distillation run's only judge/teacher engine (real vLLM)
killed the same way is restarted and scores the step it died in; staleness 1 with two real vLLM engines through
train.py (cluster=2a1l's end-to-end run); and staleness 1 with a share of the prompts generated on the learner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from rl.rollout.hf import HFRollout
from rl.rollout.teacher import TeacherEngine
from tests.helpers import LENGTH_REWARD, LengthReward, metric_rows, run_train, sigkill_self_once

pytestmark = pytest.mark.slow


class KilledOnce(HFRollout):
    """Kills its own process with SIGKILL when its second generate call starts: the first actor to get there
    in a run does it (the marker file, created exclusively, says which pid); its restart does not."""

    marker = ""  # set on a subclass made per test (the class travels to the actors by value)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def generate(self, prompts, sampling, seeds=None):
        self.calls += 1
        if self.calls == 2:
            sigkill_self_once(self.marker)
        return super().generate(prompts, sampling, seeds)


class Env:
    def train_items(self):
        return [{"messages": [{"role": "user", "content": f"Say {i} things."}], "answer": ""} for i in range(12)]

    def eval_items(self):
        return []


def two_hf_actors(tiny_model: Path, tis_cap: float = 0.0, **cluster: Any):
    """The actor-fault runs' config: 4 steps of 4 prompts x 2 samples of 8 tokens on two HF actors (staleness 1,
    two restarts each) and one learner, the tiny model in float32; `cluster` adds to the cluster group."""
    from rl.config.choices import DType, RolloutBackend
    from rl.config.cluster import ClusterConfig
    from rl.config.schema import AlgorithmConfig, CheckpointConfig, EvalConfig, ModelConfig, RunConfig, TrainConfig

    return TrainConfig(
        run=RunConfig(steps=4, prompts_per_step=4, sync_probe_threshold=0.01),
        eval=EvalConfig(size=0),
        checkpoint=CheckpointConfig(interval=0),
        algorithm=AlgorithmConfig(group_size=2, tis_cap=tis_cap),
        model=ModelConfig(
            path=str(tiny_model), dtype=DType.float32, learner_dtype=DType.float32, max_new_tokens=8, lora_rank=4
        ),
        cluster=ClusterConfig(
            num_actors=2,
            rollout_backend=RolloutBackend.hf,
            cpus_per_actor=0.5,
            cpus_per_learner=1,
            learner_threads=1,
            staleness=1,
            actor_max_restarts=2,
            **cluster,
        ),
    )


@dataclass
class FaultRun:
    """What train_with gives back: the samples each optimizer step was given, the run's rows, the resolved config,
    the tokenizer and what `after` returned."""

    steps: list[list[Any]]
    rows: list[dict]
    cfg: Any
    tokenizer: Any
    after: Any = None

    def groups(self) -> list[list[tuple[int, ...]]]:
        """Each step's prompt groups, in the order the learners got them."""
        return [list(dict.fromkeys(tuple(s.prompt_ids) for s in step)) for step in self.steps]

    def expected_groups(self) -> list[list[tuple[int, ...]]]:
        """Env's prompts in data order, a step's worth each: every prompt of every step trained once, in order."""
        from rl.loop.driver import prompt_data

        data = prompt_data(Env().train_items(), self.tokenizer, self.cfg)
        n = self.cfg.run.prompts_per_step
        return [[tuple(data.prompt_ids[i]) for i in data.next_batch(n)] for _ in range(self.cfg.run.steps)]


def train_with(tiny_model, tmp_path, monkeypatch, actor_class: type | None, cfg, env, after=None) -> FaultRun:
    """driver.train of `cfg` on a real local Ray with `actor_class` as the rollout actors (None: the configured ones),
    recording what each learners' step was given; `after(runtime)` runs before the teardown."""
    from transformers import AutoTokenizer

    import rl.rollout
    from rl import app
    from rl.loop import driver
    from rl.metrics import MetricsLogger
    from rl.resolve import resolve

    if actor_class is not None:
        monkeypatch.setattr(rl.rollout, "rollout_class", lambda backend: actor_class)
    cfg = resolve(cfg, tmp_path / "run", model_path=str(tiny_model))
    runtime, teardown = app.build_runtime(cfg)
    steps: list[list[Any]] = []
    real_submit = runtime.submit_train_step  # the driver starts every learners' step through it
    runtime.submit_train_step = lambda samples: (steps.append(list(samples)), real_submit(samples))[1]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    logger = MetricsLogger(tmp_path / "run", kind="none", total_steps=cfg.run.steps)
    try:
        driver.train(cfg, runtime, tokenizer, env, LengthReward(), logger, resolved={})
        extra = after(runtime) if after else None
    finally:
        teardown()
        logger.close()
    return FaultRun(steps, metric_rows(tmp_path / "run", timings=True), cfg, tokenizer, extra)


def test_killed_actor_is_restarted_and_every_prompt_is_trained_once(tiny_model, tmp_path, monkeypatch, capsys):
    from rl.types import Sampling

    def serving(runtime) -> set[tuple[int, bool]]:  # which actors answer, and whether with the current adapter
        after = runtime.generate([[1, 2, 3]] * 4, Sampling(n=1, max_tokens=4))
        return {(r.actor, r.adapter_version == runtime.version) for r in after}

    marker = tmp_path / "killed.pid"
    killer = type("KilledOnceHere", (KilledOnce,), {"marker": str(marker)})
    run = train_with(tiny_model, tmp_path, monkeypatch, killer, two_hf_actors(tiny_model), Env(), after=serving)
    assert run.groups() == run.expected_groups()  # every prompt of every step, once, in order
    rows = run.rows
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["fault/actor_restarts"] for r in rows) == 1.0
    assert all(r["data/kept_groups"] == 4 for r in rows)
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert marker.is_file()  # it really was killed
    out = capsys.readouterr().out
    assert "died during generate" in out and "Ray restarts it (restart 1 of 2)" in out
    assert "prompt(s) go to actor" in out and "is back after its restart" in out
    assert run.after == {(0, True), (1, True)}  # both actors serve again, the current adapter


class RefusesItsRestart(KilledOnce):
    """KilledOnce whose restart raises in __init__, as a vLLM engine does when the memory it needs is gone: Ray
    does not try that actor again."""

    def __init__(self, *args, **kwargs):
        if Path(self.marker).is_file():
            raise ValueError("no room for the KV cache on this restart")
        super().__init__(*args, **kwargs)


def test_an_actor_whose_restart_fails_is_left_out_at_once(tiny_model, tmp_path, monkeypatch, capsys):
    """The killed actor's restart raises: the pool leaves it out at once (no wait for a restart that will not come),
    says why, and the other actor takes its prompts and the rest of the run."""
    marker = tmp_path / "killed.pid"
    refuser = type("RefusesItsRestartHere", (RefusesItsRestart,), {"marker": str(marker)})
    run = train_with(
        tiny_model,
        tmp_path,
        monkeypatch,
        refuser,
        two_hf_actors(tiny_model),
        Env(),
        after=lambda runtime: (runtime.pool.gone, runtime.pool.live()),
    )
    assert marker.is_file()
    assert run.groups() == run.expected_groups() and [r["step"] for r in run.rows] == [1, 2, 3, 4]
    out = capsys.readouterr().out
    assert "could not be restarted (ValueError: no room for the KV cache on this restart): left out" in out
    gone, live = run.after
    assert len(gone) == 1 and live == [1 - min(gone)]


class TeacherKilledOnce(TeacherEngine):
    """A real judge/teacher engine that kills its own process with SIGKILL when its second token_logprobs call
    starts (step 2's scoring); its restart does not (the marker file says it happened)."""

    marker = ""  # set on a subclass made per test (the class travels to the actor by value)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def token_logprobs(self, prompts, completions):
        self.calls += 1
        if self.calls == 2:
            sigkill_self_once(self.marker)
        return super().token_logprobs(prompts, completions)


@pytest.mark.tier2  # three vLLM engine starts (the teacher twice) on the 2-core machine
def test_killed_teacher_is_restarted_and_the_run_goes_on(tiny_model, tmp_path, monkeypatch, capsys):
    """algorithm=distill with one teacher engine, killed while it scores step 2: Ray restarts it, the driver waits
    for it (no other teacher is live) and sends it step 2's samples again; every step is scored and trained, and
    `fault/teacher_restarts` counts the one restart."""
    import rl.rollout.teacher
    from rl.config.choices import DType, RolloutBackend
    from rl.config.cluster import ClusterConfig
    from rl.config.schema import AlgorithmConfig, CheckpointConfig, EvalConfig, ModelConfig, RunConfig, TrainConfig

    marker = tmp_path / "killed.pid"
    cfg = TrainConfig(
        run=RunConfig(steps=3, prompts_per_step=2, sync_probe_threshold=0.01),
        eval=EvalConfig(size=0),
        checkpoint=CheckpointConfig(interval=0),
        algorithm=AlgorithmConfig(group_size=2, distill_coef=1.0, task_reward_coef=0.0, kl_coef=0.0),
        model=ModelConfig(
            path=str(tiny_model), dtype=DType.float32, learner_dtype=DType.float32, max_new_tokens=8, lora_rank=4
        ),
        cluster=ClusterConfig(
            rollout_backend=RolloutBackend.hf,
            cpus_per_actor=0.5,
            cpus_per_learner=1,
            cpus_per_teacher=0.5,
            learner_threads=1,
            actor_threads=1,
            num_teachers=1,
            gpu_memory_utilization=0.05,
            actor_max_restarts=2,
        ),
    )
    killer = type("TeacherKilledOnceHere", (TeacherKilledOnce,), {"marker": str(marker)})
    monkeypatch.setattr(rl.rollout.teacher, "TeacherEngine", killer)
    run = train_with(tiny_model, tmp_path, monkeypatch, None, cfg, Env())
    rows = [r for r in run.rows if "distill/kl_per_token" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]  # step 2 was scored after all, by the restarted engine
    assert [r["fault/teacher_restarts"] for r in rows] == [0.0, 1.0, 0.0]
    assert all(r["train/samples_with_signal"] > 0 for r in rows)
    assert marker.is_file()  # it really was killed
    out = capsys.readouterr().out
    assert "judge/teacher 0 died during token_logprobs" in out and "Ray restarts it (restart 1 of 2)" in out
    assert "prompt(s) go to actor 0" in out  # the same engine, once it is back: it was the only one


def test_staleness_one_with_vllm_engines(tiny_model, tmp_path):
    """cluster=2a1l's end-to-end run too (tests/integration/test_topologies.py): prompts split over two vLLM
    engines, each sent every adapter."""
    out = tmp_path / "run"
    proc = run_train(
        [
            f"model.path={tiny_model}",
            f"run.output_dir={out}",
            "cluster=2a1l",
            "cluster.staleness=1",
            "cluster.gpu_memory_utilization=0.1",
            "cluster.actor_threads=1",
            "cluster.learner_threads=1",
            "run.steps=3",
            "run.prompts_per_step=2",
            "algorithm.group_size=4",
            "eval.size=0",
            "model.max_new_tokens=12",
            *LENGTH_REWARD,
            "model.dtype=float32",
            "model.learner_dtype=float32",
            "run.sync_probe_threshold=0.01",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metric_rows(Path(out), timings=True)
    # step 3 trains on samples of the adapter published after step 1 while the learner holds step 2's
    assert [r["actor/adapter_version"] for r in rows] == [0.0, 0.0, 1.0]
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(r["sync/logprob_abs_diff"] < 0.01 for r in rows[1:])  # the probe of each sync, read a step later
    assert all(0 <= r["perf/actor_idle_frac"] <= 1 and 0 <= r["perf/learner_idle_frac"] <= 1 for r in rows)
    assert "2 rollout actor(s), 1 learner(s)" in proc.stdout
    weights = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert any(float(t.abs().max()) > 0 for k, t in weights.items() if "lora_B" in k)


def test_learner_generation_with_staleness_on_ray(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_train(
        [
            f"model.path={tiny_model}",
            f"run.output_dir={out}",
            "cluster=1a1l",
            "cluster.rollout_backend=hf",
            "cluster.staleness=1",
            "cluster.learner_chunk_size=1",
            "cluster.learner_threads=1",
            "run.steps=3",
            "run.prompts_per_step=4",
            "algorithm.group_size=4",
            "eval.size=2",
            "model.max_new_tokens=8",
            *LENGTH_REWARD,
            "model.dtype=float32",
            "model.learner_dtype=float32",
            "run.sync_probe_threshold=0.01",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metric_rows(Path(out), timings=True)
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["data/learner_generated_frac"] for r in steps] == [0.25] * 3  # 1 of 4 prompts on the learner
    assert [r["async/staleness_max"] for r in steps] == [0.0, 1.0, 1.0]
    assert all(r["data/kept_groups"] == 4 for r in steps)
    assert all(r["sync/logprob_abs_diff"] < 0.01 for r in steps[1:])


class KilledInASegment(HFRollout):
    """Kills its own process with SIGKILL when its third segment call of a continuous rollout starts (once per
    test, as KilledOnce)."""

    marker = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def continue_samples(self, prompts, sampling, caps, seeds):
        self.calls += 1
        if self.calls == 3:
            sigkill_self_once(self.marker)
        return super().continue_samples(prompts, sampling, caps, seeds)


class ManyPrompts(Env):
    def train_items(self):  # one pass covers the run: a prompt trained twice would be a repeated draw
        return [{"messages": [{"role": "user", "content": f"Say {i} things."}], "answer": ""} for i in range(24)]


def test_continuous_rollouts_lose_no_sample_when_an_actor_dies_mid_segment(tiny_model, tmp_path, monkeypatch, capsys):
    """cluster.rollout_mode=continuous with two actors, one killed in the middle of a segment: Ray restarts it, the
    segment goes to the other actor, and every step still trains 4 distinct prompt groups of full samples."""
    from rl.config.choices import RolloutMode

    marker = tmp_path / "killed.pid"
    cfg = two_hf_actors(tiny_model, tis_cap=2.0, rollout_mode=RolloutMode.continuous, segment_tokens=2)
    killer = type("KilledInASegmentHere", (KilledInASegment,), {"marker": str(marker)})
    run = train_with(tiny_model, tmp_path, monkeypatch, killer, cfg, ManyPrompts())
    trained = [g for step in run.groups() for g in step]
    lengths = [len(s.completion_ids) for step in run.steps for s in step]
    rows = run.rows
    assert marker.is_file()  # it really was killed
    assert len(trained) == 16 and len(set(trained)) == 16  # 4 steps x 4 groups, no draw twice
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["data/kept_groups"] == 4 for r in rows)
    assert sum(r["fault/actor_restarts"] for r in rows) == 1.0
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert sum(r["async/segments_continued"] for r in rows) > 0 and 1 <= min(lengths) and max(lengths) <= 8
    out = capsys.readouterr().out
    assert "died during continue_samples" in out and "Ray restarts it (restart 1 of 2)" in out
