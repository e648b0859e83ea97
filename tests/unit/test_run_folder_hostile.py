"""A run folder is trusted by what it holds, not by its names: a damaged or empty newest checkpoint is passed over
(named in one line) or stops the resume in one line; a damaged summary.json or a metrics.jsonl whose tail is not
text never ends in a traceback; a run.output_dir holding someone's own files is refused before anything is written;
a finished run is recognised with or without checkpoints."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from rl.config.schema import ConfigError
from rl.loop import checkpoint
from rl.metrics import MetricsLogger
from rl.resolve import check_run_dir_is_new
from rl.run_files import read_metrics
from rl.types import Adapter
from tests.helpers import typed_config


def save(run_dir, step: int):
    adapter = Adapter(version=step, config={"r": 4}, weights=b"weights-%d" % step)
    return checkpoint.save(
        run_dir,
        step,
        learner_state={"adapter": adapter, "optimizer": b"opt", "torch_rng": b""},
        trainer_state={"step": step, "data": {"cursor": 2 * step}},
        config={"steps": 9},
    )


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------------------------------------ checkpoints


def test_an_empty_newest_checkpoint_is_passed_over_and_named(tmp_path, capsys):
    save(tmp_path, 1), save(tmp_path, 2)
    (tmp_path / "checkpoints" / "step_0003").mkdir()  # a copy cut short, a hand-made folder
    assert checkpoint.resolve_resume("auto", tmp_path).name == "step_0002"
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "step_0003 is damaged (no meta.json)" in out
    assert "resuming from step_0002, the newest whole checkpoint" in out
    assert checkpoint.latest(tmp_path).name == "step_0002"
    assert (tmp_path / "checkpoints" / "step_0003").is_dir()  # left for its owner to look at


def test_a_truncated_file_makes_a_checkpoint_damaged_and_pruning_keeps_whole_ones(tmp_path, capsys):
    save(tmp_path, 1), save(tmp_path, 2)
    pkl = tmp_path / "checkpoints" / "step_0002" / "learner.pkl"
    pkl.write_bytes(pkl.read_bytes()[:10])
    assert checkpoint.resolve_resume("auto", tmp_path).name == "step_0001"
    assert "learner.pkl has 10 bytes, meta.json says" in capsys.readouterr().out
    # a resumed run saving again with keep_last=1 keeps its newest whole checkpoint, not the damaged one
    checkpoint.save(
        tmp_path,
        3,
        learner_state={"adapter": Adapter(3, {"r": 4}, b"w"), "optimizer": b"", "torch_rng": b""},
        trainer_state={"step": 3},
        keep_last=1,
    )
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [3]
    assert (tmp_path / "checkpoints" / "step_0002").is_dir()


def test_no_whole_checkpoint_stops_the_resume_naming_the_damaged_folder(tmp_path):
    save(tmp_path, 1)
    (tmp_path / "checkpoints" / "step_0001" / "meta.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(ConfigError) as e:
        checkpoint.resolve_resume("auto", tmp_path)
    assert "holds no whole checkpoint" in one_line(e) and "step_0001 is damaged (meta.json does not read" in str(
        e.value
    )
    with pytest.raises(ConfigError) as e:  # the finished-run check, which runs first, says the same
        checkpoint.finished_summary("auto", tmp_path, 4)
    assert "step_0001 is damaged" in one_line(e)
    with pytest.raises(ConfigError) as e:
        checkpoint.resolve_resume(str(tmp_path / "checkpoints" / "step_0001"), tmp_path)
    assert one_line(e).startswith("run.resume=") and "this checkpoint is damaged" in str(e.value)
    with pytest.raises(ConfigError) as e:  # the eval tool's adapter= too
        checkpoint.find_policy(tmp_path / "checkpoints" / "step_0001")
    assert "this checkpoint is damaged" in one_line(e)


def test_a_checkpoint_without_the_size_list_resumes_when_its_files_are_there(tmp_path):
    """meta.json without "files": the five files present and none empty make it whole; its load is exact."""
    path = save(tmp_path, 2)
    meta = json.loads((path / "meta.json").read_text())
    del meta["files"]
    (path / "meta.json").write_text(json.dumps(meta))
    assert checkpoint.resume_point("auto", tmp_path) == (path, None)
    assert checkpoint.load(path)[0] == {"step": 2, "data": {"cursor": 4}}
    (path / "config.json").write_bytes(b"")
    assert checkpoint.damage(path) == "config.json is empty"


def test_a_checkpoint_whose_bytes_do_not_unpickle_stops_in_one_line_naming_it(tmp_path):
    path = save(tmp_path, 2)
    size = (path / "trainer.pkl").stat().st_size
    (path / "trainer.pkl").write_bytes(b"\x00" * size)  # the sizes match: only the load can tell
    assert checkpoint.damage(path) is None
    with pytest.raises(ConfigError) as e:
        checkpoint.load(path)
    assert f"checkpoint {path} is damaged (trainer.pkl: " in one_line(e)
    (path / "trainer.pkl").write_bytes(pickle.dumps([1]).ljust(size, b"."))  # unpickles, but is not a trainer state
    with pytest.raises(ConfigError, match="trainer.pkl: ValueError: not a trainer state"):
        checkpoint.load(path)


# ------------------------------------------------------------------------------------------------ summary and metrics


def test_a_damaged_summary_stops_the_resume_in_one_line(tmp_path):
    save(tmp_path, 4)
    for damaged in (b'{"eval/accuracy_after": 0.', b"\xff\xfe\x00", b"[1, 2]"):
        (tmp_path / "summary.json").write_bytes(damaged)
        with pytest.raises(ConfigError) as e:
            checkpoint.finished_summary("auto", tmp_path, 4)
        assert f"{tmp_path / 'summary.json'} is damaged" in one_line(e) and "move it out of" in str(e.value)
        assert (tmp_path / "summary.json").read_bytes() == damaged


def test_a_finished_run_without_checkpoints_is_recognised(tmp_path):
    """checkpoint.interval=0: the summary's step count says the run is done; asked for more steps, with nothing to
    continue from, the run refuses rather than start over on top of the finished one."""
    (tmp_path / "summary.json").write_text(json.dumps({"eval/accuracy_after": 0.5, "run/steps": 4}))
    assert checkpoint.finished_summary("auto", tmp_path, 4) == {"eval/accuracy_after": 0.5, "run/steps": 4}
    assert checkpoint.finished_summary("auto", tmp_path, 3) is not None
    with pytest.raises(ConfigError) as e:
        checkpoint.finished_summary("auto", tmp_path, 6)
    assert "finished 4 steps and holds no checkpoint to continue from" in one_line(e)
    # a summary without the count: the finished run's last logged step (its final evaluation's row)
    (tmp_path / "summary.json").write_text(json.dumps({"eval/accuracy_after": 0.5}))
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/mean": 0.1}) + "\n" for s in range(5))
    )
    assert checkpoint.finished_summary("auto", tmp_path, 4) == {"eval/accuracy_after": 0.5}


def test_a_metrics_tail_that_is_not_text_is_dropped_not_a_traceback(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in range(3):
        logger.log(step, {"reward/mean": float(step)})
    logger.close()
    with open(tmp_path / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 3, "reward/mean": \xff\xfe\x80\n\x00\x00\xc3')  # a crash's garbage
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    logger = MetricsLogger(tmp_path)
    assert logger.value_at(1, "reward/mean") == 1.0
    assert logger.drop_after(1) == 3  # step 2's row and the two garbage lines
    logger.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]


# ------------------------------------------------------------------------------------------------ run.output_dir


def check(run_dir, resume=None):
    cfg = typed_config(**{"run.output_dir": str(run_dir), "run.resume": resume or "null"})
    check_run_dir_is_new(cfg, run_dir)


def test_a_folder_of_someones_own_files_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")  # the user's own adapter
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    for resume in (None, "auto"):
        with pytest.raises(ConfigError) as e:
            check(tmp_path, resume)
        assert "holds files that are not a run's (adapter, notes.txt)" in one_line(e)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    (tmp_path / "notes.txt").unlink()
    with pytest.raises(ConfigError, match=r"not a run's \(adapter\)"):  # an adapter/ alone is no run either
        check(tmp_path)


def test_a_run_writes_into_a_new_folder_or_its_own(tmp_path):
    check(tmp_path / "new")
    fresh = tmp_path / "fresh"
    for name in (".hydra", "logs"):  # what Hydra and the driver's log leave before a run's first row
        (fresh / name).mkdir(parents=True)
    (fresh / "train.log").write_text("")
    check(fresh), check(fresh, "auto")
    run = tmp_path / "run"
    ckpt = save(run, 2)
    (run / "notes.txt").write_text("a note beside the run")  # a run's folder stays its own
    check(run, "auto"), check(run, str(ckpt))
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints\): give run.resume=auto"):
        check(run)
    other = tmp_path / "other"
    save(other, 1)
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints\): run.resume=<a checkpoint> starts"):
        check(other, str(ckpt))


def test_a_summary_that_a_run_with_nothing_to_do_returns_stays_as_it_was(tmp_path):
    from train import write_summary

    write_summary(tmp_path, {"eval/accuracy_after": 0.5}, steps=4)
    written = tmp_path / "summary.json"
    assert json.loads(written.read_text()) == {"eval/accuracy_after": 0.5, "run/steps": 4}
    stamp = written.stat().st_mtime_ns
    os.utime(written, ns=(stamp - 10**9, stamp - 10**9))
    write_summary(tmp_path, json.loads(written.read_text()), steps=3)  # what app.run returns when the run is done
    assert written.stat().st_mtime_ns == stamp - 10**9 and json.loads(written.read_text())["run/steps"] == 4


def test_a_sweep_summary_reads_a_job_with_a_damaged_summary_as_unfinished(tmp_path):
    from rl.tools import sweep

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 0.1, "time/step_s": 1.0}) + "\n")
    (tmp_path / "summary.json").write_bytes(b"\xff")
    row = sweep.job_row(tmp_path)
    assert row["status"] == "incomplete" and row["eval_accuracy"] is None


@pytest.mark.parametrize("key", ["eval.save_dir", "logger.rollouts_dir"])
def test_step_files_outside_the_run_go_only_into_a_new_or_empty_folder(tmp_path, key):
    """eval.save_dir and logger.rollouts_dir given outside run.output_dir take the run's step_N.jsonl: a new run
    refuses such a folder that holds files (its step_0001.jsonl would be replaced), a resumed run writes on there."""
    theirs = tmp_path / "shared"
    theirs.mkdir()
    (theirs / "step_0001.jsonl").write_text('{"mine": 1}\n')
    cfg = typed_config(**{"run.output_dir": str(tmp_path / "run"), key: str(theirs)})
    with pytest.raises(ConfigError) as e:
        check_run_dir_is_new(cfg, tmp_path / "run")
    assert f"{key}={theirs} holds files already (step_0001.jsonl)" in one_line(e)
    assert (theirs / "step_0001.jsonl").read_text() == '{"mine": 1}\n'
    resumed = typed_config(**{"run.output_dir": str(tmp_path / "run"), key: str(theirs), "run.resume": "auto"})
    check_run_dir_is_new(resumed, tmp_path / "run")
    empty = typed_config(**{"run.output_dir": str(tmp_path / "run"), key: str(tmp_path / "empty")})
    check_run_dir_is_new(empty, tmp_path / "run")


def test_hydras_own_folder_inside_the_run_folder_is_the_runs(tmp_path):
    """hydra.run.dir inside run.output_dir: what Hydra wrote there before the run starts is the run's own."""
    (tmp_path / "hydra" / ".hydra").mkdir(parents=True)
    cfg = typed_config(**{"run.output_dir": str(tmp_path)})
    check_run_dir_is_new(cfg, tmp_path, tmp_path / "hydra")
    with pytest.raises(ConfigError, match=r"not a run's \(hydra\)"):  # not Hydra's folder for this job
        check_run_dir_is_new(cfg, tmp_path, tmp_path.parent / "elsewhere")
