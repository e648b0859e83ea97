"""End to end: train.py on multi-turn episodes (env=retry) with the tiny random model, on Ray + vLLM CPU: episodes
run on the actor, the learner trains on their model tokens, and the metrics, evaluation and rollout dumps show whole
episodes. The episode loop is the rollout engines' shared base (rl/rollout/episodes.py); tests/unit/test_episodes.py
runs it on a scripted engine (several turns) and on the HF backend (one turn)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import TINY_RUN, check_trained, metric_rows, run_train

pytestmark = pytest.mark.slow

# The judge is the run's reward (LengthReward, 1 at 300 characters): the random model's answers are judged right
# at 0.3 (about 90 characters), so some episodes end after one answer and others retry. Short turns, two eval prompts.
RETRY = [
    *(a for a in TINY_RUN if not a.startswith(("eval.size=", "model.max_new_tokens="))),
    "eval.size=2",
    "model.max_new_tokens=10",
    "+reward.scale=300",
    "env=retry",
    "env.inner.size=64",
    "env.threshold=0.3",
    "logger.rollouts_interval=1",
    "cluster.gpu_memory_utilization=0.1",
]


def check_episodes(out) -> None:
    steps = check_trained(out)
    for r in steps:
        assert r["env/turns_mean"] > 1 and r["env/turns_max"] <= 3
        assert 0 < r["env/env_token_frac"] < 1
        assert r["env/tool_calls_per_episode"] == 0
    evals = [r for r in metric_rows(out, timings=True) if "eval/accuracy" in r]
    assert evals and all(r["eval/turns_mean"] >= 1 for r in evals)  # evaluation runs episodes too
    rows = [json.loads(line) for line in (out / "rollouts" / "step_0001.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    multi = [r for r in rows if r["turns"] > 1]
    assert multi
    for r in multi:
        assert [s["by"] for s in r["spans"]][:3] == ["model", "env", "model"]
        assert "That is not correct, try again." in r["spans"][1]["text"]
        assert r["length"] == sum(s["tokens"] for s in r["spans"] if s["by"] == "model")
        assert [m["role"] for m in r["messages"]][:3] == ["assistant", "user", "assistant"]


def test_retry_episodes_on_ray_with_vllm(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_train([f"model.path={tiny_model}", f"run.output_dir={out}", "cluster=1a1l", *RETRY])
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_episodes(out)
