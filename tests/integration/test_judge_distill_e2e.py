"""train.py with a judge/teacher engine beside the actor and the learner, on a real local Ray and real vLLM CPU
engines, the embedded SmolLM2-135M-Instruct as the student: SmolLM2 as its judge, whose score it raises; SmolLM2 with
an adapter trained on chain_sum as its teacher, whose KL to it falls; and `python -m rewards.check reward=judge`
with SmolLM2 as the judge."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, metric_rows, repo_env, run_train

# 70 s and more each on the 2-core machine: the second tier. Their thresholds were measured in bf16, where the CPU
# computes it natively; elsewhere the dtypes' auto runs them in fp32 (bf16 there took them past their 10 minutes)
pytestmark = [pytest.mark.slow, pytest.mark.tier2]


def test_a_judged_run_raises_its_judge_score(tmp_path):
    """reward=judge with SmolLM2 as the student and as its judge (teacher.path null: the student's model): the
    judge is asked for every completion that is not blocked, its verdicts are parsed (or the failures counted), and
    the mean judge score rises over 6 steps. What rises is what the judge rewards, not the task: a SmolLM2 judge
    echoes a bare number as its score, and the student learns to answer "9" to every question (docs/benchmarks.md,
    0.27 -> 0.90 in 12 steps, held flat from step 7). So: the mean of the last two steps 0.2 above the first."""
    out = tmp_path / "run"
    proc = run_train(
        [
            f"run.output_dir={out}",
            "reward=judge",
            "run.seed=0",
            "run.steps=6",
            "run.prompts_per_step=8",
            "algorithm.group_size=4",
            "algorithm.lr=1e-3",
            "cluster.num_teachers=1",
            "cluster.cpus_per_actor=0.5",
            "cluster.cpus_per_teacher=0.5",
            "cluster.gpu_memory_utilization=0.1",
            "cluster.teacher_memory_utilization=0.1",
            "eval.size=0",
            "checkpoint.interval=0",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in metric_rows(out, timings=True) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for r in steps:
        assert r["judge/calls"] + r["judge/blocked"] == 32 and r["judge/calls"] > 0 and r["judge/latency_s"] > 0
        assert r["judge/parse_failures"] + r["judge/too_long"] <= r["judge/calls"]
    score = [r["reward/mean"] for r in steps]
    print("judge score by step:", [round(x, 3) for x in score])
    assert (score[-1] + score[-2]) / 2 > score[0] + 0.2
    assert (out / "logs" / "teacher0.log").is_file()


def test_distillation_lowers_the_students_kl_to_a_teacher_trained_on_the_task(tmp_path):
    """The issue's distillation run: the teacher is SmolLM2 plus an adapter trained for 8 steps on chain_sum
    demonstrations (algorithm=sft, "The answer is N."), served by the teacher engine (teacher.adapter); the student
    is the base SmolLM2 (algorithm=distill). The student samples, the teacher scores each of its tokens, and the
    student's per-token KL to the teacher falls step by step as it takes up the teacher's way of answering.

    Measured with these settings (docs/benchmarks.md): 1.47, 0.97, 0.64, 0.39, 0.32, 0.43, 0.52, 0.27 nats per
    token; a 12-step run with a teacher trained on 256 demonstrations fell 1.76 -> 0.12, its late steps 0.12-0.35
    (noise of about 0.1 from step to step). So: the first step above 0.8, the mean of the last three below half of
    it, and the second half's KL below the first half's."""
    demos = tmp_path / "chain_sum.jsonl"
    cmd = [sys.executable, "-m", "rl.tools.demos", "--n", "64", "--out", str(demos)]
    made = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    common = ["run.seed=0", "eval.size=0", "checkpoint.interval=0", "run.prompts_per_step=8", "algorithm.lr=1e-3"]
    teacher = tmp_path / "teacher"
    proc = run_train([*common, "algorithm=sft", f"algorithm.demos={demos}", "run.steps=8", f"run.output_dir={teacher}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "student"
    proc = run_train(
        [
            *common,
            "algorithm=distill",
            f"teacher.adapter={teacher}",
            "cluster.num_teachers=1",
            "cluster.cpus_per_actor=0.5",
            "cluster.cpus_per_teacher=0.5",
            "cluster.teacher_memory_utilization=0.1",
            "run.steps=8",
            "algorithm.group_size=4",
            f"run.output_dir={out}",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kl = [r["distill/kl_per_token"] for r in metric_rows(out, timings=True) if "distill/kl_per_token" in r]
    print("distill/kl_per_token by step:", [round(k, 3) for k in kl])
    assert len(kl) == 8 and all(math.isfinite(k) for k in kl)
    assert kl[0] > 0.8  # the trained teacher is visibly another model than the base
    assert sum(kl[-3:]) / 3 < kl[0] / 2
    assert sum(kl[4:]) < sum(kl[:4])


def test_the_judge_check_starts_a_judge_and_blocks_every_exploit():
    """`python -m rewards.check reward=judge` starts a SmolLM2 judge engine in its process and runs the judge's own
    suite: every flattering, instructing or copying completion scores 0; how well SmolLM2 grades is printed, with a
    warning that it scores a wrong answer stating "10" as high as a right one."""
    proc = subprocess.run(
        [sys.executable, "-m", "rewards.check", "reward=judge"],
        cwd=REPO,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "judge engine started" in proc.stdout
    assert "the judge model grades correct answers" in proc.stdout
    assert re.search(r"PASS: (\d+)/\1 exploit attempts blocked", proc.stdout), proc.stdout
    # SmolLM2 reads a wrong answer's "10" as its score (what a judged run learned to say): warned, not gated
    assert "WARNING: this judge scores 'The answer is 10.' as high as correct answers" in proc.stdout
