"""The smallest real run of a benchmark that starts Ray and a vLLM engine (bench.scaling, one actor, a few tokens):
the benches' own Ray/vLLM code paths start on this machine, and the result goes to the results file it is given. The
smallest run of bench.packs, whose sides are train.py sweeps. The other benches' set-up is checked without starting
anything in tests/unit/test_bench_scripts.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, TINY_RUN, repo_env

pytestmark = [pytest.mark.slow, pytest.mark.tier2]


def test_scaling_bench_measures_one_actor(tiny_model, tmp_path):
    args = ["--model", str(tiny_model), "--actors", "1", "--prompts", "2", "--n", "2", "--max-tokens", "8"]
    results = tmp_path / "results.jsonl"  # not the repository's bench/results.jsonl
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scaling", *args, "--repeats", "1"],
        cwd=REPO,
        env=repo_env(RLFT_BENCH_RESULTS=str(results)),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"bench": "scaling", "actors"')]
    assert [r["actors"] for r in rows] == [1] and rows[0]["tokens_per_s"] > 0
    (line,) = [json.loads(x) for x in results.read_text().splitlines()]
    assert line["bench"] == "scaling" and line["result"]["measured"][0]["tokens_per_s"] > 0


def test_packs_bench_runs_a_sweep_job_after_job_and_as_a_pack(tiny_model, tmp_path):
    """bench.packs on a sweep of two tiny in-process jobs (cluster=local, HF generation): both sides train every job,
    the table and the results line come out, and a second call with the same --out reads the sides back."""
    results = tmp_path / "results.jsonl"
    workload = [f"model.path={tiny_model}", *TINY_RUN, "cluster=local", "cluster.rollout_backend=hf", "logger=none"]
    args = ["--preset", "cpu", "--sweep", "algorithm.lr=1e-5,1e-4", "--packs", "2", "--repeats", "1"]

    def bench() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "bench.packs", *args, "--out", str(tmp_path / "out"), "--", *workload],
            cwd=REPO,
            env=repo_env(RLFT_BENCH_RESULTS=str(results)),
            capture_output=True,
            text=True,
            timeout=600,
        )

    proc = bench()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| #1 algorithm.lr=0.0001 | 0.000 | 0.000 | 0.000 |" in proc.stdout  # a random model answers nothing
    (line,) = [json.loads(x) for x in results.read_text().splitlines()]
    runs = line["result"]["runs"]
    assert [r["side"] for r in runs] == ["sequential", "pack2"]
    assert all([j["samples"] for j in r["jobs"]] == [16, 16] for r in runs)  # 2 steps x 2 prompts x 4 samples
    assert line["result"]["sides"]["pack2"]["speedup"]["n"] == 1
    again = bench()
    assert again.returncode == 0, again.stderr[-3000:]
    first, second = [json.loads(x) for x in results.read_text().splitlines()]
    assert second["result"]["runs"] == first["result"]["runs"]  # read back, not run again
