"""`python -m rl.tools.eval` end to end, as a user runs it: a tiny adapter trained for one step, then the base model and
that adapter evaluated side by side on a real vLLM CPU engine; the table, results.json and the per-sample files
are checked against each other."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, repo_env, run_train, tiny_args

pytestmark = pytest.mark.slow

N, EVAL_SIZE, THRESHOLD = 4, 3, 0.05


def test_eval_command_base_vs_adapter_on_vllm(tiny_model, tmp_path):
    run = tmp_path / "run"
    proc = run_train(
        [
            *tiny_args(tiny_model),
            f"run.output_dir={run}",
            "logger=none",
            "run.steps=1",
            "run.prompts_per_step=2",
            "algorithm.group_size=2",
            "model.max_new_tokens=6",
            "eval.size=0",
            "checkpoint.interval=1",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "adapter" / "adapter_config.json").is_file()

    out = tmp_path / "eval"
    args = [
        *tiny_args(tiny_model, in_process=False),  # the tiny model and its reward, on the default vLLM engine
        f"eval_out={out}",
        f"eval.size={EVAL_SIZE}",
        f"eval.n_samples={N}",
        f"eval.correct_threshold={THRESHOLD}",
        "model.max_new_tokens=8",
        "cluster.gpu_memory_utilization=0.1",
        f"adapter={run}",  # last: the failing call below replaces it
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "rl.tools.eval", *args],
        cwd=REPO,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"trained: run {run / 'adapter'}" in proc.stdout
    # the console holds the command's own lines; the engine's configuration and notices are in its log file
    assert " INFO " not in proc.stdout + proc.stderr and "non-default args" not in proc.stdout + proc.stderr
    assert "non-default args" in (out / "logs" / "engine.log").read_text()
    assert f"engine log: {out / 'logs' / 'engine.log'}" in proc.stdout

    doc = json.loads((out / "results.json").read_text())
    assert set(doc["metrics"]) == {"base", "trained"} and doc["n_samples"] == N
    header = next(ln for ln in proc.stdout.splitlines() if ln.startswith("eval set"))
    assert header.split()[-3:] == ["base", "trained", "delta"] and doc["table"] in proc.stdout
    for label, version in (("base", 0), ("trained", 1)):
        rows = [json.loads(ln) for ln in (out / f"{label}.jsonl").read_text().splitlines()]
        greedy = [r for r in rows if r["mode"] == "greedy"]
        sampled = [r for r in rows if r["mode"] == "sampled"]
        assert len(greedy) == EVAL_SIZE and len(sampled) == EVAL_SIZE * N
        assert {r["adapter_version"] for r in rows} == {version}  # the adapter was loaded for (only) the trained one
        assert all(r["correct"] == (r["reward"] >= THRESHOLD) for r in rows)
        m = doc["metrics"][label]
        assert m["eval/accuracy"] == pytest.approx(sum(r["correct"] for r in greedy) / EVAL_SIZE)
        assert m["eval/pass@1"] == pytest.approx(sum(r["correct"] for r in sampled) / len(sampled))  # avg@n
        assert m["eval/pass@1"] <= m[f"eval/pass@{N}"] <= 1.0
        assert f"{m['eval/accuracy']:.3f}" in doc["table"]

    proc = subprocess.run(
        [sys.executable, "-m", "rl.tools.eval", *args[:-1], f"adapter={tmp_path / 'nothing'}"],
        cwd=REPO,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith(f"error: adapter={tmp_path / 'nothing'}: no such file or folder")
