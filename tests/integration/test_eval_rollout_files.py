"""The files a run writes besides metrics: per-sample eval jsonl (greedy + sampled, pass@k) and rollout dumps.

One tiny run in one process (cluster=local, HF rollout: no Ray, no vLLM); every number in the files is checked
against the reward that produced it and against the metrics logged for the same step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rl.loop.evaluation import pass_at_k
from tests.helpers import run_train, tiny_args

pytestmark = pytest.mark.slow

# THRESHOLD: the tiny model's sampled completions score 0.2-0.6 with the length reward, so prompts get 0 < c < n
N_SAMPLES, THRESHOLD, MAX_NEW, BUFFER = 4, 0.4, 6, 2


def read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def length_reward(text: str) -> float:  # tests.helpers.LengthReward
    return min(len(text) / 100.0, 1.0)


def test_eval_and_rollout_files(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_train(
        [
            *tiny_args(tiny_model),
            f"run.output_dir={out}",
            "logger=none",
            "run.steps=2",
            "run.prompts_per_step=2",
            "algorithm.group_size=3",
            f"model.max_new_tokens={MAX_NEW}",
            "checkpoint.interval=0",
            "eval.size=3",
            "eval.interval=1",
            f"eval.n_samples={N_SAMPLES}",
            "eval.pass_k=[1,2,4]",
            f"eval.correct_threshold={THRESHOLD}",
            "logger.rollouts_interval=2",
            "algorithm.overlong_penalty=true",  # shaped reward != task reward for long completions
            f"algorithm.overlong_buffer={BUFFER}",
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 2/2 [" in proc.stdout  # progress with elapsed<ETA in the console line

    # --- evaluation: before training (0), eval.interval (1), after training (2); nothing half-written
    metrics = read(out / "metrics.jsonl")
    mixed = 0  # prompts with some but not all samples correct: where pass@k differs from pass@1 and from 0/1
    assert sorted(p.name for p in (out / "eval").iterdir()) == ["step_0000.jsonl", "step_0001.jsonl", "step_0002.jsonl"]
    for step in (0, 1, 2):
        rows = read(out / "eval" / f"step_{step:04d}.jsonl")
        greedy = [r for r in rows if r["mode"] == "greedy"]
        sampled = [r for r in rows if r["mode"] == "sampled"]
        assert len(greedy) == 3 and len(sampled) == 3 * N_SAMPLES
        assert [r["sample"] for r in sampled] == list(range(N_SAMPLES)) * 3
        for r in rows:
            assert r["step"] == step and r["adapter_version"] == step
            assert "Give the final answer as a number" in r["prompt"] and r["answer"]
            assert r["reward"] == pytest.approx(length_reward(r["completion"]))
            assert r["correct"] == (r["reward"] >= THRESHOLD)
            assert r["finish_reason"] in ("stop", "length") and 1 <= r["length"] <= MAX_NEW
        # the same prompts, in the same order, greedy and sampled
        assert [r["prompt"] for r in sampled] == [r["prompt"] for r in greedy for _ in range(N_SAMPLES)]

        logged = [m for m in metrics if m["step"] == step and "eval/accuracy" in m]
        assert len(logged) == 1
        m = logged[0]
        assert m["eval/accuracy"] == pytest.approx(np.mean([r["correct"] for r in greedy]))
        assert m["eval/reward_mean"] == pytest.approx(np.mean([r["reward"] for r in greedy]))
        assert m["eval/pass@1"] == pytest.approx(np.mean([r["correct"] for r in sampled]))
        correct = [sum(r["correct"] for r in sampled[i * N_SAMPLES : (i + 1) * N_SAMPLES]) for i in range(3)]
        mixed += sum(0 < c < N_SAMPLES for c in correct)
        for k in (2, 4):
            assert m[f"eval/pass@{k}"] == pytest.approx(np.mean([pass_at_k(N_SAMPLES, c, k) for c in correct]))
        assert m["eval/pass@1"] <= m["eval/pass@2"] <= m["eval/pass@4"]
    assert mixed > 0, "every prompt was all-correct or all-wrong: the pass@k checks above would be vacuous"

    # --- rollout dump: only step 2 (logger.rollouts_interval=2), every completion of the step
    assert [p.name for p in (out / "rollouts").iterdir()] == ["step_0002.jsonl"]
    rows = read(out / "rollouts" / "step_0002.jsonl")
    assert len(rows) == 2 * 3
    assert [(r["group"], r["sample"]) for r in rows] == [(g, j) for g in range(2) for j in range(3)]
    for r in rows:
        assert r["step"] == 2 and r["actor"] == 0
        assert r["adapter_version"] == 1  # step 2 samples come from the adapter published after step 1
        assert "<|im_start|>" in r["prompt"]  # decoded from the prompt ids: chat template included
        assert r["reward"] == pytest.approx(length_reward(r["completion"]))
        assert r["finish_reason"] in ("stop", "length") and 1 <= r["length"] <= MAX_NEW
        penalty = max((MAX_NEW - BUFFER - r["length"]) / BUFFER, -1.0) if r["length"] > MAX_NEW - BUFFER else 0.0
        if penalty:
            assert r["shaped_reward"] == pytest.approx(r["reward"] + penalty)
        else:
            assert "shaped_reward" not in r
    # GRPO advantages: zero mean within each group
    for g in range(2):
        assert abs(sum(r["advantage"] for r in rows if r["group"] == g)) < 1e-4
    step2 = next(m for m in metrics if m["step"] == 2 and "reward/mean" in m)
    assert step2["reward/mean"] == pytest.approx(np.mean([r["reward"] for r in rows]))
    assert step2["adv/mean"] == pytest.approx(np.mean([r["advantage"] for r in rows]), abs=1e-6)
    assert any("shaped_reward" in r for r in rows) or all(r["length"] <= MAX_NEW - BUFFER for r in rows)
