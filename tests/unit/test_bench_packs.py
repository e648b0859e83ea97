"""bench.packs's sides in parts (bench/packs_parts.py), without running train.py: how the GPU preset's sweep is cut
and its jobs mapped back, which pack sides may be cut, a side assembled from the result files its parts leave, the
refusals (a missing or unfinished part, two devices, another workload, two splits), the report over assembled sides,
and bench/gpu/packs.sh's `report` over carried parts. The real smallest run is in tests/integration/
test_bench_smoke.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile

import pytest

from bench import packs
from bench.packs_parts import FOLDER, Incomplete, Part, check_device_here, check_whole_packs
from tests.helpers import REPO, repo_env

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


@pytest.fixture(scope="module")
def gpu():
    """The GPU preset's arguments, its 8 jobs and their labels."""
    args = packs.parser().parse_args(["--preset", "gpu"])
    listed = packs.jobs(args)
    return args, listed, packs.labels(args, listed)


def write_part(out, gpu, side, part, wall_s, device=H100, after=0.5, **changed):
    """The folder a finished part leaves under --out (run_part's result.json), its command from `changed` args."""
    args, listed, names = gpu
    if "argv" in changed:
        args = packs.parser().parse_args(["--preset", "gpu", *changed["argv"]])
        listed = packs.jobs(args)
    folder = out / part.folder(side, 0)
    swept, numbers = packs.part_sweep(args, listed, part)
    jobs = [
        {"job": n, "label": names[n], "steps": 24, "samples": 512, "accuracy_before": 0.359, "accuracy_after": after}
        | {"start_s": 8.0 + 200 * i, "job_s": 200.0 + n}
        for i, n in enumerate(numbers)
    ]
    info = {"host": "gpu", "cpus": 16, "gpu": device, "load_avg": [0.1], "date": changed.get("date", "2026-12-07")}
    if "speed" in changed:
        info["speed"] = changed["speed"]
    result = {
        **{"bench": "packs", "side": side, "repeat": 0, "part": str(part), "wall_s": wall_s, "startup_s": 8.0},
        **{"samples": 512 * len(jobs), "samples_per_s": 512 * len(jobs) / wall_s, "jobs": jobs, "device": device},
        **{"caches": [] if part.k == 1 else ["vllm"], "machine": {**info, "commit": "abc1234"}},
        "command": packs.train_args(side, folder / "sweep", args, swept),
    }
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result))
    return folder


def write_sequential(out, gpu, walls=(400.0, 410.0, 420.0, 430.0), skip=(), speeds=None):
    for k, wall in enumerate(walls, start=1):
        if k not in skip:
            speed = {} if speeds is None else {"speed": speeds[k - 1]}
            write_part(out, gpu, "sequential", Part(k, len(walls)), wall, **speed)


def test_part_cuts_the_first_swept_key_and_keeps_the_sweeps_job_numbers(gpu):
    args, listed, names = gpu
    assert packs.part_sweep(args, listed, Part(2, 4)) == (["algorithm.lr=0.0001", "run.seed=0,1"], [2, 3])
    assert packs.part_sweep(args, listed, Part(2, 2)) == (["algorithm.lr=0.0002,0.0004", "run.seed=0,1"], [4, 5, 6, 7])
    # more parts than learning rates: each rate's jobs cut by the next key, one job a part
    assert packs.part_sweep(args, listed, Part(4, 8)) == (["algorithm.lr=0.0001", "run.seed=1"], [3])
    for m in (1, 2, 4, 8):
        numbers = [n for k in range(1, m + 1) for n in packs.part_sweep(args, listed, Part(k, m))[1]]
        assert numbers == list(range(8))
    assert [names[n] for n in packs.part_sweep(args, listed, Part(4, 4))[1]] == [
        "algorithm.lr=0.0004 run.seed=0",
        "algorithm.lr=0.0004 run.seed=1",
    ]
    with pytest.raises(SystemExit) as refused:
        packs.part_sweep(args, listed, Part(1, 3))
    message = str(refused.value)
    assert "swept key algorithm.lr has 4 values, which 3 parts cannot share evenly; give M in 1, 2, 4, 8" in message
    assert "\n" not in message
    with pytest.raises(SystemExit, match="--part 2of4: give K/M"):
        packs.parse_part("2of4")


def test_a_pack_side_is_cut_only_into_packs_the_launcher_forms(gpu):
    """pack4 of the 8 jobs forms #0-#3 and #4-#7: two parts hold one pack each, four parts would form packs of 2."""
    args, listed, _ = gpu
    for side, m in (("pack4", 2), ("pack2", 4), ("pack2", 2)):
        for k in range(1, m + 1):
            check_whole_packs(listed, side, packs.pack_size(side), packs.part_sweep(args, listed, Part(k, m))[1])
    for side, part in (("pack4", Part(1, 4)), ("pack8", Part(2, 2))):
        with pytest.raises(SystemExit, match=f"a part must hold whole packs of the launcher; .* run {side} whole"):
            check_whole_packs(listed, side, packs.pack_size(side), packs.part_sweep(args, listed, part)[1])


def test_a_side_is_the_sum_of_its_parts_and_reports_beside_a_whole_one(gpu, tmp_path):
    args, listed, names = gpu
    write_sequential(tmp_path, gpu)
    write_part(tmp_path, gpu, "pack8", Part(), 415.0, after=0.6)
    side = packs.side_result("sequential", 0, tmp_path, args, listed, names)
    assert side["wall_s"] == 1660.0 and side["samples"] == 8 * 512 and side["samples_per_s"] == round(4096 / 1660, 3)
    assert [j["job"] for j in side["jobs"]] == list(range(8)) and [j["label"] for j in side["jobs"]] == names
    assert [p["part"] for p in side["parts"]] == ["1/4", "2/4", "3/4", "4/4"] and side["device"] == H100
    results, gaps = packs.collect(["sequential", "pack8"], [0], tmp_path, args, listed, names)
    assert gaps == [] and [r["side"] for r in results] == ["sequential", "pack8"]
    table = packs.report(results, ["sequential", "pack8"], names)
    assert "| pack8 | 415.0 (415.0-415.0, n=1) | 9.870 (9.870-9.870, n=1) | 4.00x (4.00-4.00, n=1) |" in table
    assert "| #7 algorithm.lr=0.0004 run.seed=1 | 0.359 | 0.500 | 0.600 |" in table
    where = packs.provenance(results).splitlines()
    assert where[0] == f"device: {H100}"
    assert where[1] == (
        "sequential repeat 0: 4 parts, 400.0 + 410.0 + 420.0 + 430.0 s; start to first job 8.0-8.0 s; each job's own "
        "s 200+201 | 202+203 | 204+205 | 206+207; compilation caches at start: none | vllm | vllm | vllm"
    )


def test_the_report_shows_each_parts_machine_speed_and_says_when_the_machines_differ(gpu, tmp_path):
    """Two lent machines with the same GPU can run one part 1.8 times apart: the report shows each part's host_speed
    and says in one line when a comparison spans machines further apart than SPEED_APART."""
    args, listed, names = gpu
    fast, slow = {"python_ms": 50.0, "launch_us": 5.0}, {"python_ms": 90.0, "launch_us": 9.1}
    write_sequential(tmp_path, gpu, speeds=[fast, fast, fast, slow])
    write_part(tmp_path, gpu, "pack8", Part(), 415.0, speed=fast)
    results, _ = packs.collect(["sequential", "pack8"], [0], tmp_path, args, listed, names)
    where = packs.provenance(results).splitlines()
    speeds = next(line for line in where if line.startswith("machine speed per part"))
    assert "sequential repeat 0 part 4/4 python 90 ms, launch 9.1 us" in speeds
    assert "pack8 repeat 0 python 50 ms, launch 5.0 us" in speeds
    assert any(line.startswith("the parts ran on machines 1.80x apart in Python speed (50-90 ms)") for line in where)
    for side in ("sequential", "pack8"):  # one machine speed: no warning; parts that did not measure it: no line
        for folder in tmp_path.glob(f"{side}-*"):
            shutil.rmtree(folder)
    write_sequential(tmp_path, gpu, speeds=[fast, fast, fast, {"python_ms": 54.0}])
    write_part(tmp_path, gpu, "pack8", Part(), 415.0)
    results, _ = packs.collect(["sequential", "pack8"], [0], tmp_path, args, listed, names)
    where = packs.provenance(results)
    assert (
        "machine speed per part" in where
        and "apart in Python speed" not in where
        and "pack8 repeat 0 python" not in where
    )


def refusal(out, gpu) -> str:
    args, listed, names = gpu
    with pytest.raises((SystemExit, Incomplete)) as refused:
        packs.side_result("sequential", 0, out, args, listed, names)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_side_is_not_assembled_from_parts_that_do_not_make_it(gpu, tmp_path):
    missing = tmp_path / "missing"
    write_sequential(missing, gpu, skip=(3,))
    assert "sequential repeat 0: part 3/4 missing under" in refusal(missing, gpu)
    args, listed, names = gpu
    assert packs.collect(["sequential"], [0], missing, args, listed, names)[1][0].endswith("(run it: --part 3/4)")
    (missing / "sequential-0-part3of4").mkdir()  # a part cut before its result
    assert "sequential-0-part3of4: a side or part that did not finish (no result.json)" in refusal(missing, gpu)

    devices = tmp_path / "devices"
    write_sequential(devices, gpu, skip=(3,))
    write_part(devices, gpu, "sequential", Part(3, 4), 420.0, device=H200)
    assert f"sequential repeat 0 part 1/4 ran on {H100}, sequential repeat 0 part 3/4 on {H200}" in refusal(
        devices, gpu
    )

    other = tmp_path / "other"
    write_sequential(other, gpu, skip=(2,))
    write_part(other, gpu, "sequential", Part(2, 4), 410.0, argv=["--", "run.steps=12"])
    assert "a result of another workload" in refusal(other, gpu)

    splits = tmp_path / "splits"
    write_sequential(splits, gpu)
    write_part(splits, gpu, "sequential", Part(1, 2), 800.0)
    assert "sequential repeat 0 has parts of 2 and of 4; keep one" in refusal(splits, gpu)

    both = tmp_path / "both"
    write_sequential(both, gpu)
    write_part(both, gpu, "sequential", Part(), 1600.0)
    assert "sequential repeat 0 is there whole and in parts" in refusal(both, gpu)

    with pytest.raises(SystemExit, match=f"ran on {H100}, this machine on {H200}: timings compare on one card kind"):
        check_device_here(both, H200)


def test_report_only_appends_the_result_line_once_every_side_is_whole(gpu, tmp_path, monkeypatch, capsys):
    results = tmp_path / "results.jsonl"
    monkeypatch.setenv("RLFT_BENCH_RESULTS", str(results))
    out = tmp_path / "out"
    write_sequential(out, gpu, skip=(4,))
    write_part(out, gpu, "pack8", Part(), 415.0, date="2026-12-08")
    argv = ["bench.packs", "--preset", "gpu", "--packs", "N", "--report-only", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    packs.main()
    printed = capsys.readouterr().out
    assert "| pack8 |" in printed and "not whole yet: sequential repeat 0: part 4/4 missing" in printed
    assert not results.exists()
    write_part(out, gpu, "sequential", Part(4, 4), 430.0)
    packs.main()
    (line,) = [json.loads(x) for x in results.read_text().splitlines()]
    assert line["claim"] == "sweep-packs" and line["result"]["device"] == H100
    assert line["machine"]["gpu"] == H100 and line["date"] == "2026-12-08" and line["commit"] == "abc1234"
    assert line["result"]["sides"]["pack8"]["speedup"]["median"] == 1660.0 / 415.0
    assert [len(r.get("parts", [])) for r in line["result"]["runs"]] == [4, 0]


def test_a_side_whose_folders_are_gone_is_restored_from_its_result_line_and_reports_as_before(
    gpu, tmp_path, monkeypatch, capsys
):
    """--restore sequential writes the sequential parts of the newest result line of this workload back under --out
    (the machine that kept their folders replaced): the side assembles as it did, the report names the line, and a
    pack side run now reports against it; refused where the side is there already or no line of this workload has it."""
    results = tmp_path / "results.jsonl"
    monkeypatch.setenv("RLFT_BENCH_RESULTS", str(results))
    before = tmp_path / "before"
    write_sequential(before, gpu)
    write_part(before, gpu, "pack8", Part(), 415.0, date="2026-12-08")
    argv = ["bench.packs", "--preset", "gpu", "--packs", "N", "--report-only", "--out"]
    monkeypatch.setattr(sys, "argv", [*argv, str(before)])
    packs.main()
    other = json.loads(results.read_text())
    other["arguments"] = [*other["arguments"], "--", "run.steps=12"]  # a newer line of another workload: skipped
    results.write_text(results.read_text() + json.dumps(other) + "\n")
    capsys.readouterr()

    after = tmp_path / "after"
    write_part(after, gpu, "pack8", Part(), 400.0, date="2026-12-09")
    monkeypatch.setattr(sys, "argv", [*argv, str(after), "--restore", "sequential", "--no-append"])
    packs.main()
    printed = capsys.readouterr().out
    assert (
        f"sequential repeat 0: restored under {after} from results.jsonl line 1 (2026-12-08, commit abc1234)" in printed
    )
    assert sorted(p.name for p in after.iterdir()) == ["pack8-0", *(f"sequential-0-part{k}of4" for k in range(1, 5))]
    args, listed, names = gpu
    assert (
        packs.side_result("sequential", 0, after, args, listed, names)["jobs"]
        == packs.side_result("sequential", 0, before, args, listed, names)["jobs"]
    )
    assert "| sequential | 1660.0 (1660.0-1660.0, n=1) |" in printed and "| 4.15x (4.15-4.15, n=1) |" in printed
    assert "restored from results.jsonl line 1 (2026-12-08, commit abc1234)" in printed

    with pytest.raises(SystemExit, match="sequential repeat 0 is there already; --restore writes only where it is not"):
        packs.main()
    monkeypatch.setattr(sys, "argv", [*argv, str(tmp_path / "new"), "--restore", "sequential", "--", "run.steps=4"])
    with pytest.raises(SystemExit, match="--restore sequential: no sweep-packs line of .* holds sequential of this"):
        packs.main()


def test_gpu_script_reports_the_parts_it_was_carried(gpu, tmp_path):
    """bench/gpu/packs.sh `report`: the carried tarballs unpacked (a cut part's left packed), the table printed; an
    unknown side stops it with its usage line."""
    made, carry = tmp_path / "made", tmp_path / "carry"
    write_sequential(made, gpu)
    carry.mkdir()
    (made / "pack8-0").mkdir()
    (made / "pack8-0" / "console.log").write_text("cut\n")
    for folder in made.iterdir():
        cut = "" if (folder / "result.json").is_file() else "-cut"
        with tarfile.open(carry / f"{folder.name}{cut}.tar.gz", "w:gz") as tar:
            tar.add(folder, arcname=folder.name)
    runs = tmp_path / "runs"
    env = repo_env(CARRY=str(carry), RUNS=str(runs), PY=sys.executable, RLFT_BENCH_RESULTS=str(tmp_path / "r.jsonl"))
    script = str(REPO / "bench" / "gpu" / "packs.sh")

    def call(*argv):
        return subprocess.run(["bash", script, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    done = call("report", "--packs", "N")
    assert done.returncode == 0, done.stderr
    assert "| sequential | 1660.0 (1660.0-1660.0, n=1) |" in done.stdout
    assert "not whole yet: pack8 repeat 0: not run" in done.stdout
    assert sorted(p.name for p in runs.iterdir()) == [f"sequential-0-part{k}of4" for k in range(1, 5)]
    assert not (tmp_path / "r.jsonl").exists()
    refused = call("sequentail", "1/4")
    assert refused.returncode == 2 and "usage: bash bench/gpu/packs.sh" in refused.stderr


def test_a_pack_side_named_each_or_grouped_sets_how_its_learner_steps(gpu, tmp_path):
    """`pack<k>-each` and `pack<k>-grouped` are the pack of k with hydra.launcher.grouped_learner=false and true (plain
    `pack<k>` keeps auto); a side named otherwise is refused in one line."""
    args, listed, _ = gpu
    picked = packs.parser().parse_args(["--preset", "gpu", "--sides", "sequential,pack8,pack8-each,pack8-grouped"])
    assert packs.sides(picked, len(listed)) == ["sequential", "pack8", "pack8-each", "pack8-grouped"]
    each = packs.train_args("pack8-each", tmp_path, args)
    assert "hydra.launcher.max_jobs=8" in each and "hydra.launcher.grouped_learner=false" in each
    assert "hydra.launcher.grouped_learner=true" in packs.train_args("pack8-grouped", tmp_path, args)
    assert not any("grouped_learner" in a for a in packs.train_args("pack8", tmp_path, args))
    with pytest.raises(SystemExit, match="pack8-all is not sequential, pack<k>, pack<k>-each or pack<k>-grouped"):
        packs.sides(packs.parser().parse_args(["--sides", "pack8-all"]), len(listed))


def test_a_part_records_the_commit_it_was_told_over_the_machines_git(monkeypatch):
    """The lent GPU machine's copy of the working tree can sit in a checkout of another commit: $RLFT_COMMIT, set by
    bench/gpu/packs.sh from COMMIT=, names what ran; without it the machine's own git does."""
    from bench.common import machine
    from bench.packs_parts import COMMIT_ENV, where_run

    monkeypatch.delenv(COMMIT_ENV, raising=False)
    here = where_run()
    assert here["commit"] == machine()["commit"] and here["speed"]["python_ms"] > 0  # measured, in its own process
    monkeypatch.setenv(COMMIT_ENV, "abc1234")
    assert where_run()["commit"] == "abc1234"


def test_a_jobs_step_parts_are_its_medians_from_step_2_and_the_report_shows_each_sides(gpu, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "summary.json").write_text(json.dumps({"eval/accuracy_before": 0.25, "eval/accuracy_after": 0.5}))
    rows = [{"step": 0, "time/eval_s": 5.0}]  # step 1 compiles: left out of the medians
    rows += [{"step": s, "train/samples": 8, "time/step_s": 10.0 * s, "time/probe_s": 1.0 + s} for s in (1, 2, 3, 4)]
    (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = packs.read_job(job)
    assert read["steps"] == 4 and read["samples"] == 32 and read["step_parts"] == {"step": 30.0, "probe": 4.0}
    args, listed, names = gpu
    write_sequential(tmp_path / "out", gpu)
    write_part(tmp_path / "out", gpu, "pack8", Part(), 415.0)
    results, _ = packs.collect(["sequential", "pack8"], [0], tmp_path / "out", args, listed, names)
    for j in results[1]["jobs"]:
        j["step_parts"] = {"step": 9.0 + j["job"], "learn": 4.0}
    table = packs.report(results, ["sequential", "pack8"], names)
    assert "| side | step | rollout | reward | learn | sync | probe | probe_samples | probe_score | prepare |" in table
    assert "| pack8 | 12.50 | - | - | 4.00 | - | - | - | - | - |" in table  # the sequential parts logged none


def test_a_pack_side_with_p_n_sets_its_phases(gpu, tmp_path):
    """`pack<k>-p<n>` (also after -each or -grouped) is the pack of k with hydra.launcher.phases=n, `-m<n>` with
    learner.pack_micro_batches=n; its folder's name reads back as that side; -p0 is refused."""
    args, listed, _ = gpu
    picked = packs.parser().parse_args(["--preset", "gpu", "--sides", "pack8-p1,pack8-p2,pack8-each-p2"])
    assert packs.sides(picked, len(listed)) == ["pack8-p1", "pack8-p2", "pack8-each-p2"]
    two = packs.train_args("pack8-p2", tmp_path, args)
    assert "hydra.launcher.max_jobs=8" in two and "hydra.launcher.phases=2" in two
    each = packs.train_args("pack8-each-p2", tmp_path, args)
    assert "hydra.launcher.grouped_learner=false" in each and "hydra.launcher.phases=2" in each
    assert not any("phases" in a for a in packs.train_args("pack8", tmp_path, args))
    assert "learner.pack_micro_batches=2" in packs.train_args("pack8-m2", tmp_path, args)
    assert "hydra.launcher.phases=2" in packs.train_args("pack8-p2-m2", tmp_path, args)
    assert FOLDER.fullmatch("pack8-p2-0")["side"] == "pack8-p2"
    assert FOLDER.fullmatch("pack8-each-p2-1-part1of2")["side"] == "pack8-each-p2"
    with pytest.raises(SystemExit, match="pack8-p0 is not sequential"):
        packs.sides(packs.parser().parse_args(["--sides", "pack8-p0"]), len(listed))
