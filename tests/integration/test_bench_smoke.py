"""The smallest real run of a benchmark that starts Ray and a vLLM engine (bench.scaling, one actor, a few tokens):
the benches' own Ray/vLLM code paths start on this machine, and the result goes to the results file it is given. The other benches' set-up is checked without starting
anything in tests/unit/test_bench_scripts.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, repo_env

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
