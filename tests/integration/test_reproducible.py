"""The same config and seed give the same run with Ray + vLLM CPU, and a resumed run equals an uninterrupted one
(staleness 0): metrics (timings aside), adapters, evaluation and rollout dumps, bit for bit. Every prompt's
request carries its own sampling seed (rl/seeds.py prompt_seed), so what the engine batches with it does not
matter. Also the quiet console: a run prints its own lines only, each role's log is in <run dir>/logs/, and
`verbose=true` shows the roles' lines (which change nothing in the results). Three runs (each starts a vLLM
engine): a, 3 steps; b, the first 2 of them with verbose=true, then resume=auto for the third."""

from __future__ import annotations

import re

import pytest

from tests.helpers import assert_resume_matches, assert_same_first_steps, run_train, tiny_args

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

RUN = [
    "cluster=1a1l",
    "cluster.gpu_memory_utilization=0.1",
    "logger=none",
    "run.prompts_per_step=2",
    "algorithm.group_size=4",
    "model.max_new_tokens=12",
    "eval.size=4",
    "eval.n_samples=2",  # sampled evaluation too: its seeds are the step's and the prompt's
    "eval.pass_k=[1,2]",
    "checkpoint.interval=1",
    "checkpoint.keep_last=0",
    "logger.rollouts_interval=1",
]


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory) -> dict:
    """a: 3 steps; b: 2 steps with run.verbose=true, then run.resume=auto to 3 steps (same run directory)."""
    root = tmp_path_factory.mktemp("repro")
    common = [*tiny_args(tiny_model, in_process=False), *RUN]
    out = {}
    for name, extra in [
        ("a", ["run.steps=3"]),
        ("b", ["run.steps=2", "run.verbose=true"]),
        ("b2", ["run.steps=3", "run.resume=auto"]),
    ]:
        run_dir = root / name[0]
        args = [*common, f"run.output_dir={run_dir}", f"hydra.run.dir={root / name / 'hydra'}", *extra]
        proc = run_train(args, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = (run_dir, proc)
    return out


def test_two_runs_of_one_config_are_identical(runs):
    """Steps 0-2 of a (3 steps) and b (2 steps, verbose): the same computation, so the same bits."""
    assert_same_first_steps(runs["a"][0], runs["b"][0], steps=2)


def test_a_resumed_vllm_run_equals_an_uninterrupted_one(runs):
    (a, _), (b, resumed) = runs["a"], runs["b2"]
    assert_resume_matches(a, b, resumed.stdout, steps=3, prompts_per_step=2)


OUR_LINE = re.compile(
    r"^(run dir: |model: |ray: |sync probe floor |step \d+/\d+|held-out accuracy |run.resume=auto|resumed from )"
)


def test_the_console_shows_the_runs_own_lines_and_the_roles_logs_are_in_the_run_directory(runs):
    (a, quiet), (b, verbose) = runs["a"], runs["b"]
    console = quiet.stdout + quiet.stderr
    assert "\x1b[" not in console
    others = [line for line in console.splitlines() if not OUR_LINE.match(line)]
    assert others == [], console[-3000:]
    for run_dir in (a, b):
        logs = run_dir / "logs"
        assert {p.name for p in logs.iterdir()} >= {"actor0.log", "learner0.log", "driver.log"}
        actor = (logs / "actor0.log").read_text()
        assert "Initializing a V1 LLM engine" in actor and " INFO " in actor  # vLLM's own lines
        assert "placement: bundle 0 -> actor 0" in (logs / "driver.log").read_text()
    # verbose=true: the roles' lines on the console, prefixed with the role, without colour codes
    assert "[actor0] " in verbose.stderr and "Initializing a V1 LLM engine" in verbose.stderr
    assert "\x1b[" not in verbose.stdout + verbose.stderr
