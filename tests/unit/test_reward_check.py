"""The reward-hacking gate: every listed exploit is blocked by the shipped math rewards."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl.tools.reward_check import EXPLOITS, PROBLEMS, build_reward, run_check
from tests.helpers import REPO, repo_env


@pytest.mark.parametrize("name", ["boxed", "think_answer_tags", "seed_10_5_0", "boxed_format"])
def test_gate_blocks_every_exploit(name):
    reward = build_reward([f"reward={name}", "reward.workers=0"])
    results, unjudged = run_check(reward)
    assert unjudged == []
    assert len(results) >= len(PROBLEMS) * (len(EXPLOITS) - 3)  # a few exploits do not apply to every problem
    assert [r for r in results if not r.passed] == []


def test_gate_catches_a_gameable_reward():
    """A pure format reward gives a well-formed wrong answer full credit: the gate must say so."""
    results, _ = run_check(build_reward(["reward=format_soft"]))
    assert {r.exploit for r in results if not r.passed} >= {"format_only_filled", "wrong_value"}


def check_command(*args: str) -> subprocess.CompletedProcess:
    """`python -m rewards.check ARGS` from the repository, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "rewards.check", *args],
        cwd=REPO,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_check_command_exit_codes():
    ok = check_command("reward=boxed")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS" in ok.stdout
    bad = check_command("reward=format_strict")
    assert bad.returncode == 1 and "FAIL" in bad.stdout
    unknown = check_command("reward=nope")
    assert unknown.returncode == 2 and unknown.stdout.startswith("error: Could not find 'reward/nope'; available: ")
    assert "boxed" in unknown.stdout and len(unknown.stdout.strip().splitlines()) == 1
