"""Sweep packs end to end (`python train.py -m ... hydra/launcher=pack`) with real Ray and a real vLLM CPU engine
on the tiny model: the jobs of a sweep train as adapters of one base in one learner and one engine, each job still a
run of its own.

Each job is a config of a group the test writes (`+job=<name>`: its reward, seed and learning rate), so one sweep
holds jobs that learn (the length reward), one that cannot (a constant reward: zero advantages, so an adapter
trained on its own samples alone never moves) and one that fails (a NaN reward with run.max_nonfinite_steps=1).
Three sweeps (each starts Ray and one engine for its pack; a LoRA slot per job, `cluster.lora_mode=native`): the four
jobs for 2 steps; the three that finish, for 4 steps, stopped with SIGTERM once each has a checkpoint; the same
command resumed. The interrupted one repeats the first pack's steps (less the failing job), so a job's metrics must
not depend on the pack it ran in. A pack of two with `cluster.lora_mode=merged` (each job's adapter merged into the
weights in its turn). A sweep split into two packs by model.lora_rank runs in process (cluster=local, HF
generation) to keep it short. About 6 minutes on 2 shared CPU cores: the pack of four 80 s, the merged pack 60 s,
the split 30 s, a pack of three in two phases 80 s, and (tier 2: vLLM runs repeated and resumed bit for bit) the interrupted and resumed sweeps 3
minutes."""

from __future__ import annotations

import csv
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rl.loop import checkpoint
from tests.helpers import (
    REPO,
    assert_same_first_steps,
    check_trained,
    jsonl,
    metric_rows,
    repo_env,
    run_train,
    sha256,
    tiny_args,
)

pytestmark = pytest.mark.slow

# the jobs, by name: reward class (tests/helpers.py), run.seed, algorithm.lr
JOBS = {
    "length": ("LengthReward", 0, 2e-4),
    "length_fast": ("LengthReward", 1, 1e-3),
    "constant": ("ConstantReward", 0, 2e-4),
    "nonfinite": ("NanReward", 0, 2e-4),
}
LEARN = ["length", "length_fast"]  # the jobs whose adapters move
FINISH = ["length", "length_fast", "constant"]  # the jobs that finish


def job_configs(root: Path) -> Path:
    """A config folder (for --config-dir) with the group `job`, one file per job of JOBS."""
    (root / "job").mkdir(parents=True)
    for name, (reward, seed, lr) in JOBS.items():
        text = f"reward:\n  _target_: tests.helpers.{reward}\nrun:\n  seed: {seed}\nalgorithm:\n  lr: {lr}\n"
        (root / "job" / f"{name}.yaml").write_text("# @package _global_\n" + text)
    return root


def sweep_args(model: Path, conf: Path, sweep: Path, jobs: list[str], *extra: str) -> list[str]:
    """The sweep of `jobs` (names of JOBS) in one pack, Ray and one vLLM CPU engine."""
    # the tiny runs' overrides less the length reward's _target_: each job's config names its reward
    common = [a for a in tiny_args(model, in_process=False) if not a.startswith("reward._target_=")]
    return [
        "-m",
        "--config-dir",
        str(conf),
        *common,
        "cluster.gpu_memory_utilization=0.1",
        "cluster.lora_mode=native",  # a LoRA slot per job and the jobs' calls merged (a GPU's auto), unless extra says
        "logger=none",
        "run.prompts_per_step=2",
        "algorithm.group_size=4",
        "model.max_new_tokens=12",
        "eval.size=4",
        "run.sync_probe_threshold=0.01",
        "run.max_nonfinite_steps=1",
        "checkpoint.interval=1",
        "checkpoint.keep_last=0",
        "logger.rollouts_interval=1",
        f"+job={','.join(jobs)}",
        "hydra/launcher=pack",
        f"hydra.sweep.dir={sweep}",
        *extra,
    ]


def job_dirs(sweep: Path, jobs: list[str]) -> dict[str, Path]:
    return {name: sweep / str(i) for i, name in enumerate(jobs)}


def summary_rows(sweep: Path) -> dict[str, str]:
    with open(sweep / "sweep_summary.csv") as f:
        return {row["overrides"]: row["status"] for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def conf(tmp_path_factory) -> Path:
    return job_configs(tmp_path_factory.mktemp("conf"))


@pytest.fixture(scope="module")
def pack_of_four(tiny_model, conf, tmp_path_factory):
    """The four jobs, 2 steps, in one pack: (their run directories by name, the sweep directory, the process)."""
    sweep = tmp_path_factory.mktemp("four") / "sweep"
    jobs = list(JOBS)
    # grouped_learner=true: the grouped learner step on the CPU (auto groups only on a GPU)
    args = sweep_args(tiny_model, conf, sweep, jobs, "run.steps=2", "hydra.launcher.grouped_learner=true")
    proc = run_train(args, timeout=900)
    return job_dirs(sweep, jobs), sweep, proc


def test_a_packed_sweep_writes_each_jobs_run_directory_as_a_solo_run_does(pack_of_four):
    dirs, sweep, proc = pack_of_four
    assert "pack 1/1: jobs #0, #1, #2, #3" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("pack: jobs #0, #1, #2, #3 share one ") == 1  # one set of roles for all four
    assert {p.name for p in (sweep / "packs" / "0" / "logs").iterdir()} >= {"actor0.log", "learner0.log"}
    for name in LEARN:
        check_trained(dirs[name])  # two steps, the actor on the adapter of the step before, the adapter moved
    for name in FINISH:
        run = dirs[name]
        assert [r["step"] for r in metric_rows(run) if "train/loss" in r] == [1, 2]
        # the PEFT learner trained the four jobs' first steps in one grouped step (rl/learner/grouped.py)
        assert [r for r in metric_rows(run, timings=True) if "train/loss" in r][0]["pack/grouped_jobs"] == 4
        assert f"+job={name}" in (run / ".hydra" / "overrides.yaml").read_text()
        assert [s for s, _ in checkpoint.list_checkpoints(run)] == [1, 2]  # whole checkpoints, each step's
        assert (run / "adapter" / "adapter_model.safetensors").is_file()
        assert (run / "summary.json").is_file() and (run / "logs" / "driver.log").is_file()
        assert [p.name for p in sorted((run / "rollouts").iterdir())] == ["step_0001.jsonl", "step_0002.jsonl"]
        assert (run / "eval" / "step_0000.jsonl").is_file() and (run / "eval" / "step_0002.jsonl").is_file()
    status = summary_rows(sweep)
    assert [status[f"+job={n}"] for n in FINISH] == ["done"] * 3
    assert status["+job=nonfinite"] != "done"


def test_a_pack_that_merges_each_jobs_adapter_into_the_weights_in_turn(tiny_model, conf, tmp_path):
    """`cluster.lora_mode=merged` (a CPU pack's auto): the engine holds one job's adapter at a time, merged back
    before each of the job's calls; the learning job's actor follows its learner (check_trained: the probe within
    0.01 nats) and the constant job, sampled between its merges, keeps LoRA's initial B = 0."""
    sweep = tmp_path / "sweep"
    jobs = ["length", "constant"]
    proc = run_train(sweep_args(tiny_model, conf, sweep, jobs, "run.steps=2", "cluster.lora_mode=merged"), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirs = job_dirs(sweep, jobs)
    check_trained(dirs["length"])
    weights = load_file(str(dirs["constant"] / "adapter" / "adapter_model.safetensors"))
    assert all(float(t.abs().max()) == 0 for k, t in weights.items() if "lora_B" in k)
    assert "lora_mode: merged" in (dirs["length"] / ".hydra" / "config.yaml").read_text()


def test_a_pack_with_bounded_staleness_keeps_each_jobs_own_bound_and_splits_the_cores(tiny_model, conf, tmp_path):
    """cluster.staleness=1 in a pack: each job's step t+1 is sampled while its step t trains, so its samples lag its
    learner by at most one version (and do lag), each job syncs its own versions, the constant job's adapter stays at
    LoRA's initial B = 0 while its mate's moves; the CPU pack split the cores between its two roles."""
    sweep = tmp_path / "sweep"
    jobs = ["length", "constant"]
    proc = run_train(sweep_args(tiny_model, conf, sweep, jobs, "run.steps=3", "cluster.staleness=1"), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirs = job_dirs(sweep, jobs)
    for name in jobs:
        steps = [r for r in metric_rows(dirs[name], timings=True) if "train/loss" in r]
        assert [r["step"] for r in steps] == [1, 2, 3]
        assert [r["sync/version"] for r in steps] == [1.0, 2.0, 3.0]  # this job's own versions
        lags = [r["step"] - 1 - r["actor/adapter_version"] for r in steps]
        assert all(0 <= lag <= 1 for lag in lags) and max(lags) == 1, lags
    weights = {n: load_file(str(dirs[n] / "adapter" / "adapter_model.safetensors")) for n in jobs}
    assert any(float(t.abs().max()) > 0 for k, t in weights["length"].items() if "lora_B" in k)
    assert all(float(t.abs().max()) == 0 for k, t in weights["constant"].items() if "lora_B" in k)
    share = max(1, (os.cpu_count() or 1) // 2)
    recorded = (dirs["length"] / ".hydra" / "config.yaml").read_text()
    assert f"actor_threads: {share}" in recorded and f"learner_threads: {share}" in recorded


def test_a_pack_in_two_phases_merges_each_phases_calls_and_trains_every_job(tiny_model, conf, tmp_path):
    """hydra.launcher.phases=2 with three jobs: phases #0, #2 and #1, whose calls merge among their own jobs only
    (the learner's steps grouped per phase: 2 jobs, and 1 for the job alone); every job trains whole, the constant
    job's adapter stays at LoRA's initial B = 0 while its mates' move."""
    sweep = tmp_path / "sweep"
    jobs = ["length", "constant", "length_fast"]
    extra = ("run.steps=2", "hydra.launcher.grouped_learner=true", "hydra.launcher.phases=2")
    proc = run_train(sweep_args(tiny_model, conf, sweep, jobs, *extra), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "pack: the jobs step in 2 phases (#0, #2 | #1; hydra.launcher.phases)" in proc.stdout
    dirs = job_dirs(sweep, jobs)
    for name, grouped in (("length", 2), ("length_fast", 2), ("constant", 1)):
        steps = [r for r in metric_rows(dirs[name], timings=True) if "train/loss" in r]
        assert [r["step"] for r in steps] == [1, 2] and [r["pack/grouped_jobs"] for r in steps] == [grouped] * 2
    for name in LEARN:
        check_trained(dirs[name])
    weights = load_file(str(dirs["constant"] / "adapter" / "adapter_model.safetensors"))
    assert all(float(t.abs().max()) == 0 for k, t in weights.items() if "lora_B" in k)


def test_each_job_trains_on_its_own_samples_only(pack_of_four):
    """The constant reward's samples have zero advantages: trained on them alone, its adapter stays as LoRA
    initialised it (lora_B zero) at every step, while its pack mates' adapters move step by step."""
    dirs, _, _ = pack_of_four
    rows = [r for r in metric_rows(dirs["constant"]) if "train/loss" in r]
    assert [(r["reward/mean"], r["reward/std"]) for r in rows] == [(0.5, 0.0)] * 2
    run = dirs["constant"]
    adapters = [run / f"checkpoints/step_000{s}/adapter/adapter_model.safetensors" for s in (1, 2)]
    adapters.append(run / "adapter" / "adapter_model.safetensors")
    assert len({sha256(p) for p in adapters}) == 1
    weights = load_file(str(adapters[-1]))
    assert all(float(t.abs().max()) == 0 for k, t in weights.items() if "lora_B" in k)
    assert any(float(t.abs().max()) > 0 for k, t in weights.items() if "lora_A" in k)
    for name in LEARN:
        moved = [dirs[name] / f"checkpoints/step_000{s}/adapter/adapter_model.safetensors" for s in (1, 2)]
        assert sha256(moved[0]) != sha256(moved[1])
    # the two learning jobs differ in seed and learning rate: different samples, different adapters
    a, b = (load_file(str(dirs[n] / "adapter" / "adapter_model.safetensors")) for n in LEARN)
    assert any(not a[k].equal(b[k]) for k in a)


def test_a_failing_job_stops_alone_and_the_sweep_exits_1_naming_it(pack_of_four):
    dirs, _, proc = pack_of_four
    assert proc.returncode == 1
    failed = dirs["nonfinite"]
    assert "error: 1 steps in a row had a non-finite loss" in proc.stderr
    assert f"resume with: python train.py run.resume=auto run.output_dir={failed} " in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 sweep job(s) failed (their errors are above): #3 (") and "+job=nonfinite" in last
    rows = [r for r in metric_rows(failed) if "train/loss" in r]
    assert [(r["step"], r["train/skipped_nonfinite"]) for r in rows] == [(1, 1.0)]
    assert not (failed / "summary.json").exists()
    for name in FINISH:  # the others trained both steps on finite losses, after the failed job had stopped
        losses = [r["train/loss"] for r in metric_rows(dirs[name]) if "train/loss" in r]
        assert len(losses) == 2 and all(abs(x) < 1e6 for x in losses)


# ------------------------------------------------------------------------------------------------ interrupt, resume


@dataclass
class Stopped:
    """A job of the interrupted pack as it stopped: its metric rows, the steps of its whole checkpoints and of all
    its checkpoint folders, whether it had finished."""

    rows: list[dict]
    whole: list[int]
    folders: list[int]
    finished: bool

    @classmethod
    def of(cls, run: Path) -> Stopped:
        whole = [s for s, _ in checkpoint.list_checkpoints(run)]
        folders = [s for s, _ in checkpoint.step_dirs(run)]
        return cls(metric_rows(run), whole, folders, (run / "summary.json").exists())

    @property
    def last(self) -> int:
        return self.whole[-1]


@pytest.fixture(scope="module")
def interrupted_and_resumed(tiny_model, conf, tmp_path_factory):
    """The three jobs that finish, 4 steps: stopped with SIGTERM once each has a whole checkpoint, then resumed with
    the command the interrupted jobs print. Returns the run directories by name, the sweep directory, the stopped
    sweep (exit status, stderr, its `interrupted:` lines and their commands), each job as it stopped, and the
    resumed sweep's process."""
    root = tmp_path_factory.mktemp("resume")
    sweep = root / "sweep"
    dirs = job_dirs(sweep, FINISH)
    args = sweep_args(tiny_model, conf, sweep, FINISH, "run.steps=4")
    err = root / "stderr.txt"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *args],
            cwd=REPO,
            env=repo_env(HYDRA_FULL_ERROR="0"),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            while not all(checkpoint.list_checkpoints(d) for d in dirs.values()):
                assert proc.poll() is None, f"the sweep exited before every job had a checkpoint: {err.read_text()}"
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:  # the sweep and what it started (Ray, the engine): its own session
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
    stopped = {name: Stopped.of(d) for name, d in dirs.items()}
    # each job's lines come labelled with its number ("#2 | interrupted: ...")
    unlabelled = [line.split(" | ", 1)[1] if line.startswith("#") else line for line in err.read_text().splitlines()]
    lines = [line for line in unlabelled if line.startswith("interrupted: ")]
    commands = [shlex.split(line.split("continue it with: ", 1)[1]) for line in lines]
    resumed = run_train(commands[0][2:], timeout=900) if commands else None
    return dirs, sweep, (proc.returncode, err.read_text(), lines, commands), stopped, resumed


@pytest.mark.tier2
def test_an_interrupted_pack_exits_130_each_job_with_whole_checkpoints_and_the_command_that_continues_it(
    interrupted_and_resumed,
):
    dirs, sweep, (code, stderr, lines, commands), stopped, _ = interrupted_and_resumed
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert lines, "no job was interrupted: every one had finished"
    for name, run in dirs.items():
        job = stopped[name]
        assert job.whole == list(range(1, job.last + 1)) and job.folders == job.whole  # no damaged one beside them
        mine = [line for line in lines if line.startswith(f"interrupted: {run}: ")]
        assert job.finished or mine == [
            f"interrupted: {run}: its last checkpoint is {checkpoint.step_dir_name(job.last)}; continue it with: "
            + shlex.join(["python", "train.py", *commands[0][2:]])
        ]
    # one command continues the sweep: the same arguments, in the same sweep directory, with run.resume=auto
    assert all(c == commands[0] for c in commands)
    assert commands[0][-2:] == [f"hydra.sweep.dir={sweep}", "run.resume=auto"]


@pytest.mark.tier2
def test_the_resumed_pack_continues_each_job_from_its_own_checkpoint(interrupted_and_resumed):
    dirs, sweep, _, stopped, resumed = interrupted_and_resumed
    assert resumed is not None and resumed.returncode == 0, resumed and resumed.stderr[-3000:]
    for name, run in dirs.items():
        job = stopped[name]
        if not job.finished:
            where = run / "checkpoints" / checkpoint.step_dir_name(job.last)
            assert f"resumed from {where}: step {job.last}" in resumed.stdout, resumed.stdout[-3000:]
        rows = metric_rows(run)
        assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]  # each step once
        kept = [r for r in job.rows if r["step"] <= job.last]
        assert [r for r in rows if r["step"] <= job.last] == kept  # the rows up to the checkpoint are the first run's
        assert (run / "summary.json").is_file()
    assert list(summary_rows(sweep).values()) == ["done"] * 3


@pytest.mark.tier2
def test_a_packed_jobs_results_do_not_depend_on_the_pack_it_ran_in(pack_of_four, interrupted_and_resumed):
    """The same job in the pack of four (2 steps, beside a job that failed) and in the pack of three (4 steps,
    stopped and resumed): its first two steps are the same bits, metrics (timings aside), checkpointed adapters,
    rollouts and the evaluation before training. First the steps the pack of three ran before it was stopped (a
    repeat alone), then the resumed run's."""
    four, _, _ = pack_of_four
    three, _, _, stopped, _ = interrupted_and_resumed

    def first_steps(rows: list[dict], upto: int) -> list[dict]:  # less the evaluation that ended the 2-step run
        return [r for r in rows if r["step"] <= upto and not (r["step"] == 2 and "eval/n" in r)]

    for name in FINISH:
        upto = min(stopped[name].last, 2)
        assert first_steps(stopped[name].rows, upto) == first_steps(metric_rows(four[name]), upto), name
        if name in LEARN:
            assert_same_first_steps(three[name], four[name], steps=2)
        else:  # the constant reward's groups have no spread, which assert_same_first_steps requires
            assert first_steps(metric_rows(three[name]), 2) == first_steps(metric_rows(four[name]), 2)
            for step in (1, 2):
                ckpt = f"checkpoints/step_000{step}/adapter/adapter_model.safetensors"
                assert sha256(three[name] / ckpt) == sha256(four[name] / ckpt)
                dump = f"rollouts/step_000{step}.jsonl"
                assert jsonl(three[name] / dump) == jsonl(four[name] / dump)


# ------------------------------------------------------------------------------------------------ split


def test_a_sweep_over_a_shared_key_runs_as_packs_split_with_one_line(tiny_model, tmp_path):
    """model.lora_rank=8,16: two packs, one after the other, and one line naming the key (in process: cluster=local
    with HF generation, the split is the launcher's alone)."""
    sweep = tmp_path / "sweep"
    small = ["run.steps=1", "run.prompts_per_step=2", "algorithm.group_size=2", "model.max_new_tokens=8"]
    proc = run_train(
        [
            "-m",
            *tiny_args(tiny_model),
            *small,
            "eval.size=0",
            "logger=none",
            "model.lora_rank=8,16",
            "hydra/launcher=pack",
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = "pack: job(s) #1 differ from #0 in model.lora_rank (16 vs 8): they train in a pack of their own"
    assert proc.stdout.splitlines().count(line) == 1, proc.stdout[-3000:]
    assert "pack 1/2: jobs #0\n" in proc.stdout and "pack 2/2: jobs #1\n" in proc.stdout
    for job, rank in (("0", 8), ("1", 16)):
        config = (sweep / job / "adapter" / "adapter_config.json").read_text()
        assert f'"r": {rank},' in config
    assert list(summary_rows(sweep).values()) == ["done", "done"]


def test_a_job_whose_reward_raises_is_one_line_and_its_pack_mate_finishes(tiny_model, tmp_path):
    """A job's own code failing (not one of train.py's one-line errors) fails that job alone: one line naming it
    and the exception, its traceback in the log file, and the sweep exits 1 after the other job has finished."""
    sweep = tmp_path / "sweep"
    common = [a for a in tiny_args(tiny_model) if not a.startswith("reward._target_=")]
    args = ["-m", *common, "run.steps=1", "run.prompts_per_step=2", "algorithm.group_size=4", "eval.size=2"]
    rewards = "reward._target_=tests.helpers.LengthReward,tests.helpers.RaisingReward"
    proc = run_train(
        [*args, "model.max_new_tokens=8", "logger=none", rewards, "hydra/launcher=pack", f"hydra.sweep.dir={sweep}"],
        timeout=600,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "RuntimeError: this reward always fails" in proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("error: 1 sweep job(s) failed (their errors are above): #1 (")
    )
    assert (sweep / "0" / "summary.json").is_file() and not (sweep / "1" / "summary.json").exists()
