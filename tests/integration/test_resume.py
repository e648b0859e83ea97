"""Exact resume (tiny model, in-process HF rollout: no Ray, no vLLM): 6 steps straight equal 3 steps + resume +
3 steps bit for bit, with a curriculum whose state the checkpoint must hold too; a run killed with SIGKILL
continues from its last checkpoint with `resume=auto`; an interrupted run (Ctrl-C, SIGTERM) prints the command that
continues it.
With Ray + vLLM the same exactness is tested in tests/integration/test_reproducible.py."""

from __future__ import annotations

import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from rl.loop import checkpoint
from tests.helpers import LENGTH_REWARD, REPO, metric_rows, repo_env, run_train, tiny_args

pytestmark = pytest.mark.slow


def args(model, out, *extra: str) -> list[str]:
    return [
        f"model.path={model}",
        f"run.output_dir={out}",
        "cluster=local",
        "cluster.rollout_backend=hf",
        "run.prompts_per_step=2",
        "algorithm.group_size=3",
        "model.max_new_tokens=6",
        "model.dtype=float32",
        "model.learner_dtype=float32",
        *LENGTH_REWARD,
        "logger=none",
        *extra,
    ]


# A curriculum on a training set small enough that prompts repeat: its state (pass rates, what it skipped) is the
# part of a resume that the data cursor alone does not hold, so the exact-resume run carries one.
CURRICULUM = (
    "curriculum=pass_rate",
    "env.size=4",  # 4 training prompts, 2 per step: every prompt comes back every other step
    "eval.size=2",
    "eval.correct_threshold=0.05",  # LengthReward: some samples of a prompt pass, some do not
    "curriculum.solved=0.5",
    "curriculum.revisit_prob=0.2",
    "checkpoint.interval=3",
    "checkpoint.keep_last=0",
)


def test_resume_with_a_curriculum_is_bitwise_identical(tiny_model, tmp_path):
    """`curriculum=pass_rate` skips prompts and logs its metrics, its state is in the checkpoints, and 6 steps
    straight equal 3 steps + `run.resume=auto` + 3 steps bit for bit (staleness 0: nothing in flight)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    for out, extra in [
        (straight, ["run.steps=6"]),
        (split, ["run.steps=3"]),
        (split, ["run.steps=6", "run.resume=auto"]),
    ]:
        proc = run_train(args(tiny_model, out, *CURRICULUM, *extra), timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    full = metric_rows(straight)
    # the cursor counts the prompts drawn, the skipped ones too: the straight run's at step 3
    cursor = int(next(r["data/cursor"] for r in full if r["step"] == 3 and "train/loss" in r))
    assert cursor >= 6  # 2 prompts per step, and the skipped ones
    resumed = [line for line in proc.stdout.splitlines() if line.startswith("resumed from")]
    assert len(resumed) == 1 and f"step 3, adapter version 3, data cursor {cursor}" in resumed[0], proc.stdout[-3000:]
    assert all("curriculum/pass_rate_1" in r for r in full if "reward/mean" in r)
    assert sum(r.get("curriculum/skipped", 0) for r in full) > 0  # something was solved and skipped
    state = pickle.loads((straight / "checkpoints" / "step_0006" / "trainer.pkl").read_bytes())
    assert state["data"]["curriculum"]["kind"] == "pass_rate" and state["data"]["curriculum"]["rates"]

    a, b = (
        load_file(straight / "adapter" / "adapter_model.safetensors"),
        load_file(split / "adapter" / "adapter_model.safetensors"),
    )
    assert a.keys() == b.keys() and a
    assert all(a[k].dtype == b[k].dtype and a[k].equal(b[k]) for k in a), "adapters differ after resume"
    mid = load_file(straight / "checkpoints" / "step_0003" / "adapter" / "adapter_model.safetensors")
    assert any(not mid[k].equal(a[k]) for k in a), "steps 4-6 did not move the adapter: the test would be vacuous"

    train_a = [r for r in full if "train/loss" in r]
    train_b = [r for r in metric_rows(split) if "train/loss" in r]
    assert [r["step"] for r in train_b] == [1, 2, 3, 4, 5, 6]
    assert train_a == train_b  # the same prompts chosen and skipped, the same samples and losses
    assert [r["sync/version"] for r in train_b] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    # evaluation before training ran once (not again on resume); the final evaluations agree
    evals_b = [r for r in metric_rows(split) if "eval/accuracy" in r]
    assert [r["step"] for r in evals_b] == [0, 3, 6]
    final_a = [r for r in full if "eval/accuracy" in r and r["step"] == 6]
    assert final_a == [evals_b[-1]]


def test_killed_run_resumes_from_last_checkpoint(tiny_model, tmp_path):
    out = tmp_path / "run"
    common = ["eval.size=0", "checkpoint.interval=1", "checkpoint.keep_last=2"]
    env = repo_env(HYDRA_FULL_ERROR="0")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args(tiny_model, out, *common, "run.steps=50")],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not checkpoint.list_checkpoints(out):  # wait for the first complete checkpoint
            assert proc.poll() is None, "the run exited before writing a checkpoint"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    last = checkpoint.list_checkpoints(out)[-1][0]

    resumed = run_train(args(tiny_model, out, *common, f"run.steps={last + 1}", "run.resume=auto"), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / checkpoint.step_dir_name(last)}: step {last}" in resumed.stdout
    train_rows = [r for r in metric_rows(out, timings=True) if "train/loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, last + 2))  # no step lost, none logged twice
    new = train_rows[-1]
    assert new["data/cursor"] == 2 * (last + 1)  # the data position continues: 2 prompts per step
    assert new["sync/version"] == last + 1  # adapter versions continue
    kept = [s for s, _ in checkpoint.list_checkpoints(out)]
    assert kept == [last, last + 1]  # keep_last=2
    assert not list((out / "checkpoints").glob(".*.tmp"))


def test_an_interrupted_sweep_continues_each_job_in_its_own_directory(tiny_model, tmp_path):
    """`-m ... run.resume=auto` with the sweep's hydra.sweep.dir and no run.output_dir: a finished job starts nothing,
    the job cut after its first step's checkpoint continues there in its own directory, and the summary has both;
    one run.output_dir for every job would mix their checkpoints and is refused before the first job starts."""
    sweep = tmp_path / "sweep"
    sweep_args = ["-m", "run.seed=0,1", *args(tiny_model, "x", "run.steps=2", "checkpoint.interval=1", "eval.size=2")]
    sweep_args = [a for a in sweep_args if not a.startswith("run.output_dir=")] + [f"hydra.sweep.dir={sweep}"]
    first = run_train(sweep_args, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    job = sweep / "1"
    straight = metric_rows(job)
    (job / "summary.json").unlink()  # as if killed after step 1's checkpoint
    shutil.rmtree(job / "checkpoints" / "step_0002")
    again = run_train([*sweep_args, "run.resume=auto"], timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{sweep / '0'} has trained its run.steps=2 steps and finished; nothing to do" in again.stdout
    assert f"resumed from {job / 'checkpoints' / 'step_0001'}: step 1" in again.stdout
    assert metric_rows(job) == straight
    assert [line.split(",")[2] for line in (sweep / "sweep_summary.csv").read_text().splitlines()[1:]] == ["done"] * 2
    shared = run_train([*sweep_args, f"run.output_dir={tmp_path / 'one'}"], timeout=120)
    assert shared.returncode == 2 and "is sweep job #0's run directory too" in shared.stderr
    assert not (tmp_path / "one").exists()


def as_from_a_terminal_with_the_signals_blocked() -> None:
    """The run's process before it starts train.py: SIGINT's own action, as a terminal's foreground command has it
    (a test session started in the background, `make test &`, ignores SIGINT and so would its children), and both
    signals blocked, as a parent may leave them (Ray starts its workers' children so): train.py unblocks them, else
    it would train on to the end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c_in_process", "sigterm_ray_vllm"])
def test_an_interrupted_run_ends_with_the_command_that_continues_it(tiny_model, tmp_path, sig):
    """Ctrl-C (SIGINT), or SIGTERM (a scheduler's stop) with Ray and vLLM, whose driver Ray would abort with a stack
    dump: the roles are torn down, no traceback, exit status 130 and one line naming the last whole checkpoint and
    the command that continues the run, which does (run in the in-process case)."""
    out = tmp_path / "run"
    common = ["eval.size=0", "checkpoint.interval=1", "run.steps=50"]
    if sig == signal.SIGINT:
        argv = args(tiny_model, out, *common)
    else:
        small = ["run.prompts_per_step=2", "algorithm.group_size=2", "model.max_new_tokens=6", "logger=none"]
        argv = [*tiny_args(tiny_model, in_process=False), f"run.output_dir={out}", *small, *common]
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *argv],
        cwd=REPO,
        env=repo_env(HYDRA_FULL_ERROR="0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal_with_the_signals_blocked,
    )
    try:
        while not checkpoint.list_checkpoints(out):
            assert proc.poll() is None, "the run exited before writing a checkpoint"
            time.sleep(0.2)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "SIGTERM received" not in stderr
    last = checkpoint.list_checkpoints(out)[-1][1]
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"interrupted: {out}: its last checkpoint is {last.name}; continue it with: python train.py "
    )
    command = shlex.split(line.split("continue it with: ", 1)[1])
    assert command[2:] == [
        *[a for a in argv if not a.startswith("run.output_dir=")],
        f"run.output_dir={out}",
        "run.resume=auto",
    ]
    if sig == signal.SIGTERM:
        return
    steps = f"run.steps={checkpoint.list_checkpoints(out)[-1][0] + 1}"  # one step more, not the 50
    resumed = run_train([*(a if not a.startswith("run.steps=") else steps for a in command[2:])])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {last}" in resumed.stdout


def test_a_damaged_newest_checkpoint_is_passed_over_and_a_finished_run_without_checkpoints_is_left_alone(
    tiny_model, tmp_path
):
    """The resume takes the newest whole checkpoint and names the damaged one in one line; a run finished without
    checkpoints is recognised by its summary (nothing retrained, nothing rewritten); a folder of the user's own files
    is refused before anything is written into it."""
    out = tmp_path / "run"
    common = ["eval.size=0", "checkpoint.keep_last=0"]
    first = run_train(args(tiny_model, out, *common, "run.steps=2", "checkpoint.interval=1"), timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    (out / "summary.json").unlink()  # as if killed after step 2's checkpoint, which a bad copy then truncated
    pkl = out / "checkpoints" / "step_0002" / "learner.pkl"
    pkl.write_bytes(pkl.read_bytes()[:100])
    resumed = run_train(args(tiny_model, out, *common, "run.steps=2", "checkpoint.interval=1", "run.resume=auto"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{pkl.parent} is damaged (learner.pkl has 100 bytes" in resumed.stdout
    assert f"resumed from {out / 'checkpoints' / 'step_0001'}: step 1" in resumed.stdout
    assert [r["step"] for r in metric_rows(out) if "train/loss" in r] == [1, 2]
    assert checkpoint.latest(out).name == "step_0002"  # saved again, whole

    done = tmp_path / "done"
    first = run_train(args(tiny_model, done, *common, "run.steps=1", "checkpoint.interval=0"), timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    files = {p.name: p.read_bytes() for p in (done / "summary.json", done / "metrics.jsonl")}
    again = run_train(args(tiny_model, done, *common, "run.steps=1", "checkpoint.interval=0", "run.resume=auto"))
    assert again.returncode == 0 and "finished; nothing to do" in again.stdout, again.stderr[-3000:]
    more = run_train(args(tiny_model, done, *common, "run.steps=2", "checkpoint.interval=0", "run.resume=auto"))
    assert more.returncode == 2 and "finished 1 steps and holds no checkpoint to continue from" in more.stderr
    assert {p.name: p.read_bytes() for p in (done / "summary.json", done / "metrics.jsonl")} == files

    mine = tmp_path / "mine"
    (mine / "adapter").mkdir(parents=True)
    (mine / "adapter" / "adapter_config.json").write_text("{}")
    (mine / "notes.txt").write_text("mine")
    refused = run_train(args(tiny_model, mine, *common, "run.steps=1"), timeout=120)
    assert refused.returncode == 2 and "holds files that are not a run's (adapter, notes.txt)" in refused.stderr
    assert sorted(p.name for p in mine.rglob("*")) == ["adapter", "adapter_config.json", "notes.txt"]
