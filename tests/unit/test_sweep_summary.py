"""Sweep summary (rl/tools/sweep.py) from synthetic job directories: values, idle fractions, files, and `make plot`."""

from __future__ import annotations

import csv
import json

import pytest

from rl.tools import plot, sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_job(folder, overrides, *, steps=3, idle=None, finished=True, rollout_tps=100.0):
    """A job directory as train.py leaves it: .hydra/overrides.yaml, metrics.jsonl, summary.json (if finished).
    Each step: rollout 2 s, reward 0.5 s, learn 6 s, sync 0.5 s, step 10 s."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    rows = [{"step": 0, "eval/accuracy": 0.25}]
    for s in range(1, steps + 1):
        row = {
            "step": s,
            "train/loss": 0.1,
            "reward/mean": 0.1 * s,
            "perf/rollout_tokens_per_s": rollout_tps * s,
            "perf/learner_tokens_per_s": 50.0,
            "time/rollout_s": 2.0,
            "time/reward_s": 0.5,
            "time/learn_s": 6.0,
            "time/sync_s": 0.5,
            "time/step_s": 10.0,
        }
        if idle:
            row["perf/actor_idle_frac"], row["perf/learner_idle_frac"] = idle
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        summary = {"eval/accuracy_before": 0.25, "eval/accuracy_after": 0.5, "reward/last": 0.1 * steps}
        (folder / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep_dir(tmp_path):
    root = tmp_path / "multirun" / "12-00-00"
    write_job(root / "0", ["algorithm=grpo", "run.seed=0", "run.steps=3"])
    write_job(root / "1", ["algorithm=dapo", "run.seed=0", "run.steps=3"], idle=(0.1, 0.2), rollout_tps=200.0)
    write_job(root / "10", ["algorithm=grpo", "run.seed=1", "run.steps=3"], steps=2, finished=False)
    write_job(root / "2", ["algorithm=dapo", "run.seed=1", "run.steps=3"])
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


def test_rows_values_and_job_order(sweep_dir):
    rows = sweep.build_summary(sweep_dir)
    assert [r["job"] for r in rows] == ["0", "1", "2", "10"]  # numeric job order, not string order
    # run.steps=3 is common to every job: only what the sweep varied labels a row
    assert [r["overrides"] for r in rows] == ["algorithm=grpo run.seed=0", "algorithm=dapo run.seed=0"] + [
        "algorithm=dapo run.seed=1",
        "algorithm=grpo run.seed=1",
    ]
    r0 = rows[0]
    assert r0["status"] == "done" and r0["steps"] == 3
    assert r0["rollout_tokens_per_s"] == pytest.approx(200.0)  # mean of 100, 200, 300
    assert r0["learner_tokens_per_s"] == pytest.approx(50.0)
    assert r0["step_s"] == pytest.approx(10.0) and r0["sync_s"] == pytest.approx(0.5)
    # synchronous split: actors busy rollout + sync = 2.5 of 10 s, learners learn + sync = 6.5 of 10 s
    assert r0["actor_idle_frac"] == pytest.approx(0.75)
    assert r0["learner_idle_frac"] == pytest.approx(0.35)
    assert r0["final_reward"] == pytest.approx(0.3)
    assert (r0["eval_accuracy_before"], r0["eval_accuracy"]) == (0.25, 0.5)
    # logged idle fractions (async runs) win over the time split
    assert (rows[1]["actor_idle_frac"], rows[1]["learner_idle_frac"]) == pytest.approx((0.1, 0.2))
    # an unfinished job still gets its measured row, without the after-training accuracy
    r10 = rows[3]
    assert r10["status"] == "incomplete" and r10["steps"] == 2
    assert r10["final_reward"] == pytest.approx(0.2) and r10["eval_accuracy"] is None
    assert r10["eval_accuracy_before"] == 0.25


def test_idle_fractions_without_time_metrics_are_unknown():
    assert sweep.idle_fractions([{"step": 1, "train/loss": 0.0}]) == (None, None)


def test_write_summary_files(sweep_dir):
    paths = sweep.write_summary(sweep_dir)
    assert [p.name for p in paths] == list(sweep.FILES)
    with (sweep_dir / "sweep_summary.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [t["job"] for t in table] == ["0", "1", "2", "10"]
    assert float(table[0]["actor_idle_frac"]) == pytest.approx(0.75)
    assert table[3]["eval_accuracy"] == ""  # unknown, not zero
    md = (sweep_dir / "sweep_summary.md").read_text()
    assert "| 1 | algorithm=dapo run.seed=0 | done | 3 | 400.0 | 50.0 | 10.00 | 0.10 | 0.20 |" in md
    assert md.count("\n| ") == 1 + 4  # header + one line per job
    png = (sweep_dir / "sweep_summary.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10000
    assert not list(sweep_dir.glob(".*.tmp"))  # temporary names renamed


def test_write_summary_of_an_empty_folder_fails(tmp_path):
    with pytest.raises(FileNotFoundError, match="no job directories"):
        sweep.write_summary(tmp_path)


def test_make_plot_on_a_sweep_dir_writes_the_summary(sweep_dir, capsys):
    assert plot.main([str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    for name in sweep.FILES:
        assert (sweep_dir / name).is_file() and str(sweep_dir / name) in out
    assert (sweep_dir / "plots" / "step_time.png").is_file()


def test_make_plot_on_one_run_writes_no_summary(sweep_dir):
    assert plot.main([str(sweep_dir / "0")]) == 0
    assert not (sweep_dir / "0" / "sweep_summary.csv").exists()


def test_hydra_config_wires_the_callback_and_the_ray_cluster_launcher():
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rl.config.schema import register_configs
    from tests.helpers import REPO

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["hydra/launcher=ray_cluster"], return_hydra_config=True)
    assert isinstance(instantiate(cfg.hydra.callbacks.sweep_summary), sweep.SweepSummary)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    assert launcher.ray.init.address == "auto" and launcher.ray.remote.num_cpus == 0


def test_a_job_whose_run_output_dir_was_swept_is_read_from_there(tmp_path):
    """`-m run.output_dir=a,b`: the job directory holds only .hydra/, the run is where run.output_dir said (relative
    to the directory the sweep started from): its row is that run's, not `no steps`."""
    root, launched = tmp_path / "sweep", tmp_path / "cwd"
    write_job(launched / "runs" / "a", ["run.output_dir=runs/a"])
    (launched / "runs" / "a" / ".hydra" / "overrides.yaml").unlink()
    job = root / "0" / ".hydra"
    job.mkdir(parents=True)
    (job / "overrides.yaml").write_text("- run.output_dir=runs/a\n")
    (job / "config.yaml").write_text("run:\n  output_dir: runs/a\n")
    (job / "hydra.yaml").write_text(f"hydra:\n  runtime:\n    cwd: {launched}\n")
    (row,) = sweep.build_summary(root)
    assert (row["status"], row["steps"], row["eval_accuracy"]) == ("done", 3, 0.5)
    runs = plot.find_runs(root)  # make plot: the job's figures come from there too
    assert list(runs) == ["0"] and len(runs["0"]) == len(sweep.read_metrics(launched / "runs" / "a" / "metrics.jsonl"))
