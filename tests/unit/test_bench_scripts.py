"""Every script in bench/ starts on this machine: its arguments parse, and the runs it would start pass `plan=true`
(the config is valid and vLLM's CPU engine fits the NUMA node it allocates on), without starting Ray or vLLM.
One real smallest run is in tests/integration/test_bench_smoke.py; bench/gpu/ needs a GPU, except
its set-up script's own bookkeeping (what is missing, refusing a work call that needs it)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, repo_env, run_train

LIBRARIES = (
    "__init__",
    "common",
    "host_speed",
    "packs_parts",
    "packs_report",
)  # modules the bench scripts import, no scripts of their own
BENCHES = sorted(p.stem for p in (REPO / "bench").glob("*.py") if p.stem not in LIBRARIES)
# SmolLM2-135M-Instruct's config.json fields that size it (the embedded model; no conversion needed to plan it)
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def smollm2_shape(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smollm2-shape")
    (folder / "config.json").write_text(json.dumps(SMOLLM2))
    return folder


def test_every_bench_script_is_covered():
    assert BENCHES == [
        "async_modes",
        "batch_dependence",
        "colocate",
        "deterministic",
        "e2e_trl",
        "e2e_unsloth",
        "learner",
        "learner_backends",
        "pack_engine",
        "packs",
        "quantized_base",
        "rollout",
        "rollout_lora_mode",
        "sampling_budget",
        "scaling",
        "shapes",
        "staleness",
        "sync",
    ], "a new bench script: add its set-up to this file"


@pytest.mark.parametrize("name", BENCHES)
def test_bench_parses_its_arguments(name, monkeypatch, capsys):
    module = importlib.import_module(f"bench.{name}")
    monkeypatch.setattr(sys, "argv", [f"bench.{name}", "--help"])
    with pytest.raises(SystemExit) as done:
        module.main()
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_pack_engine_sides_differ_in_one_engine_setting_each_and_compare_with_the_solo_engine(tmp_path):
    """bench.pack_engine: `solo` is a solo GPU run's engine (merged adapter), every other side native LoRA (a pack's),
    `pack_graphs` with CUDA graphs; the table's last column is each side's seconds per sample over solo's."""
    from bench import pack_engine
    from rl.resolve import from_overrides

    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    for side in pack_engine.SIDES:
        c = from_overrides(str(tmp_path), *pack_engine.engine_keys(side, "cuda")).cluster
        assert c.use_gpu and c.lora_mode.value == ("merged" if side == "solo" else "native")
        assert c.enforce_eager == (side != "pack_graphs")

    def row(jobs, seconds):
        return {"jobs": jobs, "samples": jobs * 512, "call_s": [seconds] * 3, "median_s": seconds}

    text = pack_engine.table({"solo": row(1, 0.5), "pack": row(8, 2.0)})
    assert "| pack | 8 x 512 | 2.000 s (2.000-2.000, n=3) | 2048 | 0.50 |" in text


def plan_fits(args: list[str]) -> str:
    proc = run_train([*args, "plan=true"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "WARNING" not in proc.stdout and proc.stdout.rstrip().endswith("fits (by this estimate)"), proc.stdout
    return proc.stdout


def test_async_modes_runs_each_mode_on_one_workload_which_fits(smollm2_shape, tmp_path):
    from bench import async_modes

    workload = [
        "cluster.actor_threads=1",
        "run.prompts_per_step=4",
        "algorithm.group_size=4",
        "model.max_new_tokens=256",
    ]
    args = async_modes.parser().parse_args(["--bound", "2", "--", *workload])
    for mode in async_modes.MODES:
        keys = async_modes.train_args(mode, tmp_path / mode, args)
        assert keys[: len(workload)] == workload and "algorithm.tis_cap=2.0" in keys  # one objective for all
        assert ("cluster.rollout_mode=continuous" in keys) == (mode == "continuous")
        plan_fits([*keys, f"model.path={smollm2_shape}"])
    assert "cluster.staleness=2" in async_modes.train_args("continuous", tmp_path, args)


def test_async_modes_table_gives_ratios_to_both_baselines():
    from bench import async_modes

    def row(mode, rate, acc):
        idle = {"actor_idle_frac": 0.5, "learner_idle_frac": 0.2, "dropped_stale_groups": 1, "partial_rollouts": 3}
        return {"mode": mode, "samples_per_s": rate, "accuracy_after": acc, **idle}

    rows = [row("sync", 1.0, 0.5), row("sync", 3.0, 0.7), row("staleness1", 2.5, 0.6), row("continuous", 5.0, 0.55)]
    table = async_modes.table(rows, ["sync", "staleness1", "continuous"])
    assert "| continuous | 5.00 (5.00-5.00, n=1) | 2.50x | 2.00x | 0.550 (0.550) | -0.050 |" in table
    assert "| sync | 2.00 (1.00-3.00, n=2) | 1.00x | 0.80x | 0.600 (0.500, 0.700) | +0.000 |" in table


def test_e2e_trl_runs_the_demo_settings_which_fit(smollm2_shape, tmp_path):
    from bench import e2e_trl

    args = e2e_trl.ours_args(4, tmp_path / "out", threads=1)
    assert not any(a.startswith("cluster.gpu_memory_utilization") for a in args)  # the demo's own share
    plan_fits([*args, f"model.path={smollm2_shape}"])


def test_e2e_trl_gpu_side_loads_as_a_config_padded_or_packed(smollm2_shape, tmp_path):
    from bench import e2e_trl
    from rl.resolve import GPU_PACKED_TOKENS, from_overrides

    for tokens, resolved in ((None, GPU_PACKED_TOKENS), (0, 0), (8192, 8192)):
        args = e2e_trl.ours_args(3, tmp_path / "out", None, e2e_trl.GPU, e2e_trl.Ours("peft", "ipc", tokens))
        keys = [a for a in args if not a.startswith(("hydra.", "logger="))]  # a Hydra setting and a config group
        cfg = from_overrides(smollm2_shape, *keys)
        learner = cfg.learner
        assert (learner.micro_batch_tokens, learner.micro_batch_size, cfg.model.learner_backend) == (
            resolved,
            32,
            "peft",
        )


@pytest.mark.parametrize("layout", ["split", "colocate"])
def test_colocate_layouts_at_7b_plan_to_fit_an_h200(layout, tmp_path):
    """Both layouts of the one-GPU comparison, at the 7B shape it is meant for: a valid config that `plan=true`
    fits on one GPU of an H200's memory (the shape's config.json alone; no weights are built)."""
    from bench import colocate
    from bench.shapes import shape_config

    model = tmp_path / "qwen2.5-7b"
    cfg = shape_config("qwen2.5-7b", vocab_size=32000)
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(model)
    prompts = colocate.write_arith_prompts(tmp_path / "arith.jsonl")
    args = colocate.train_args(layout, str(model), prompts, tmp_path / "out", 5, [])
    out = plan_fits([*args, "plan_gpu_memory_gib=139"])
    assert ("colocated" in out) == (layout == "colocate")


def test_colocate_reads_a_layouts_row_from_its_run_folder(tmp_path, capsys):
    """A layout's row: steps 2-N of metrics.jsonl, the largest per-step learner peak, vLLM's KV-cache line in the
    actor's log; with both layouts' rows the report prints the ratios."""
    from bench import colocate

    for layout, step, kv in (("split", 6.0, "3,527,952"), ("colocate", 4.0, "7,192,752")):
        run = tmp_path / layout
        (run / "logs").mkdir(parents=True)
        (run / "logs" / "actor0.log").write_text(f"INFO ... [kv_cache_utils.py:1] GPU KV cache size: {kv} tokens\n")
        rows = [
            {"step": i, "time/step_s": 30.0 if i == 1 else step, "time/learn_s": 1.0, "memory/learner_peak_gb": i}
            for i in (1, 2, 3)
        ]
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        row = colocate.summarise(layout, run, wall_s=100.0)
        (tmp_path / f"{layout}.json").write_text(json.dumps(row))
        assert row["step_s"]["median"] == step and row["steps"] == 3 and row["learner_peak_gib"] == 3
        assert row["startup_s"] == 100.0 - 30.0 - 2 * step and row["actor_sleep_s"] is None
    assert colocate.kv_cache_tokens(tmp_path / "colocate" / "logs" / "actor0.log") == 7192752
    colocate.report(tmp_path, "qwen2.5-7b")
    printed = capsys.readouterr().out
    assert "| split (qwen2.5-7b" in printed and "7,192,752 tokens" in printed
    ratios = json.loads(printed.strip().splitlines()[-1])["ratios"]
    assert ratios == {"split_step_over_colocated_step": 1.5, "colocated_kv_over_split_kv": 2.04}


@pytest.mark.parametrize(("preset", "n_jobs"), [("gpu", 8), ("cpu", 4)])
def test_packs_presets_are_one_pack_of_jobs_which_fit(smollm2_shape, tmp_path, preset, n_jobs):
    """Each preset's sweep lists its jobs, every job may train in a pack (rl/pack.py `refusal`) and all share one
    pack of the whole sweep (`split`); a job's own run fits (`plan=true`, the GPU preset on an 80 GiB card)."""
    from bench import packs
    from rl.config.schema import TrainConfig, register_configs
    from rl.entry import compose_checked
    from rl.pack import refusal, split

    register_configs()  # what train.py does at import: the schema Hydra composes the jobs against
    args = packs.parser().parse_args(["--preset", preset, "--", f"model.path={smollm2_shape}"])
    jobs = packs.jobs(args)
    assert len(jobs) == n_jobs and len(set(packs.labels(args, jobs))) == n_jobs
    typed = [compose_checked(str(REPO / "conf"), "train", job, TrainConfig)[1] for job in jobs]
    assert [refusal(cfg) for cfg in typed] == [None] * n_jobs
    assert split(typed, n_jobs) == ([list(range(n_jobs))], [])
    assert packs.sides(args, n_jobs) == ["sequential", "pack2", "pack4"] + (["pack8"] if n_jobs == 8 else [])
    gpu = ["plan_gpu_memory_gib=80"] if preset == "gpu" else []
    plan_fits([*jobs[0], *gpu])
    pack4 = packs.train_args("pack4", tmp_path / "sweep", args)
    assert pack4[0] == "-m" and "hydra/launcher=pack" in pack4 and "hydra.launcher.max_jobs=4" in pack4
    assert not any("launcher" in a for a in packs.train_args("sequential", tmp_path / "sweep", args))


def test_packs_report_puts_each_jobs_accuracy_beside_its_sequential_run():
    """Speed-ups pair the sides of one repeat; accuracies are medians over the repeats; the seed spread is the
    sequential side's largest gap between the seeds of one learning rate."""
    from bench import packs

    names = ["algorithm.lr=1e-4 run.seed=0", "algorithm.lr=1e-4 run.seed=1"]

    def side(name, repeat, wall, after):
        jobs = [{"label": n, "accuracy_before": 0.25, "accuracy_after": a} for n, a in zip(names, after)]
        return {"side": name, "repeat": repeat, "wall_s": wall, "samples_per_s": 64 / wall, "jobs": jobs}

    results = [
        side("sequential", 0, 400.0, [0.5, 0.7]),
        side("pack2", 0, 100.0, [0.55, 0.6]),
        side("sequential", 1, 300.0, [0.5, 0.7]),
        side("pack2", 1, 150.0, [0.55, 0.6]),
    ]
    assert packs.speedups(results, "pack2") == [4.0, 2.0]
    table = packs.report(results, ["sequential", "pack2"], names)
    assert "| pack2 | 125.0 (100.0-150.0, n=2) | 0.533 (0.427-0.640, n=2) | 3.00x (2.00-4.00, n=2) |" in table
    assert "| #1 algorithm.lr=1e-4 run.seed=1 | 0.250 | 0.700 | 0.600 |" in table
    assert "seed spread (sequential, held-out after): 0.200" in table
    assert table.endswith("pack2: largest |after - sequential's after| over the jobs: 0.100")


def test_packs_names_a_side_it_cannot_run():
    from bench import packs

    for argv, wrong in ((["--sides", "sequential,pak4"], "pak4 is not"), (["--packs", "2,all"], "--packs 2,all")):
        with pytest.raises(SystemExit, match=wrong):
            packs.sides(packs.parser().parse_args(argv), 4)
    assert packs.sides(packs.parser().parse_args(["--packs", "2,N,16"]), 4) == ["sequential", "pack2", "pack4"]


@pytest.mark.parametrize("kind", ["unsloth", "peft"])
def test_quantized_base_sides_are_valid_configs(smollm2_shape, kind):
    """Each side of bench.quantized_base resolves as a run would (GPU, 4-bit learner): `learner` loads the
    dequantized copy, `quantized` model.path in NF4 with native LoRA, `original` model.path as it is."""
    from bench.quantized_base import SIDES, config

    cfgs = {side: config(str(smollm2_shape), kind, side, 0.35) for side in SIDES}
    assert "nf4-dequantized" in cfgs["learner"].model.actor_path
    assert cfgs["quantized"].model.actor_path == cfgs["original"].model.actor_path == str(smollm2_shape)
    assert [cfgs[s].cluster.lora_mode for s in SIDES] == ["merged", "native", "merged"]


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_sides_are_the_demo_which_fits(smollm2_shape, tmp_path, deterministic):
    from bench import deterministic as bench

    args = bench.parser().parse_args([f"model.path={smollm2_shape}"])
    plan_fits(bench.train_args(deterministic, tmp_path / "run", args))


def test_staleness_vllm_share_fits(tiny_model, tmp_path):
    from bench import staleness

    defaults = staleness.parser().parse_args([])
    plan_fits(staleness.train_args(1, tiny_model, tmp_path / "run", defaults))


def test_scaling_actor_share_fits(tiny_model):
    from bench import scaling

    defaults = scaling.parser().parse_args([])
    for actors in (1, 2):
        keys = scaling.actor_overrides(str(tiny_model), defaults.prompts, actors, defaults)
        plan_fits(
            [
                f"model.path={tiny_model}",
                *keys,
                f"cluster.num_actors={actors}",
                f"run.prompts_per_step={defaults.prompts}",
                f"algorithm.group_size={defaults.n}",
            ]
        )


@pytest.mark.parametrize("mode", ["merged", "native"])
def test_sync_actor_share_fits(smollm2_shape, mode):
    from bench import sync

    keys = sync.actor_overrides(str(smollm2_shape), mode, 64)
    plan_fits([f"model.path={smollm2_shape}", *keys, "run.prompts_per_step=8", "algorithm.group_size=8"])


def test_sampling_budget_compares_runs_at_the_smallest_token_total(tmp_path, monkeypatch, capsys):
    from bench import sampling_budget

    for name, per_step, skipped in (("a", 100, 0), ("b", 200, 3)):
        run = tmp_path / name
        run.mkdir()
        rows = [{"step": 0, "eval/accuracy": 0.25}]
        rows += [{"step": s, "data/generated_tokens": per_step, "curriculum/skipped": skipped} for s in (1, 2, 3, 4)]
        rows[2]["eval/accuracy"], rows[4]["eval/accuracy"] = 0.5, 0.75  # evaluations after steps 2 and 4
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "summary.json").write_text(json.dumps({"time/total_s": 60.0}))
    monkeypatch.setattr(sys, "argv", ["bench.sampling_budget", str(tmp_path / "a"), str(tmp_path / "b")])
    monkeypatch.setenv("RLFT_BENCH_RESULTS", str(tmp_path / "results.jsonl"))
    sampling_budget.main()
    out = capsys.readouterr().out
    assert "token budget: 400 generated tokens" in out
    assert "| a | 4 | 400 | 0.750 | 0.750 (4) | 0 | 60 |" in out
    assert "| b | 4 | 800 | 0.750 | 0.500 (2) | 12 | 60 |" in out  # b's 400 tokens were spent by step 2
    (line,) = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert line["bench"] == "sampling_budget" and line["result"]["budget_tokens"] == 400
    assert line["result"]["runs"][str(tmp_path / "b")]["accuracy_at_budget"] == 0.5


def test_rollout_summarises_the_rows_a_cut_run_printed(tmp_path, monkeypatch, capsys):
    """A GPU call's time limit can cut bench.rollout between its processes: `--rows` pools what it printed as the
    whole run would (each side's calls over its processes; per-round ratios only where both sides ran that round)."""
    from bench import rollout

    machine = {"gpu": "GPU", "date": "2026-12-08 01:24 UTC", "load_avg": [1.0, 1.0, 1.0], "commit": "abc1234"}

    def row(side: str, rates: list[float]) -> str:
        return json.dumps(
            {"bench": "rollout", "model": "qwen2.5-0.5b", "side": side, "rates": rates, "machine": machine}
        )

    printed = [row("raw_vllm", [100.0, 110.0]), "INFO engine log line", row("ours_vllm_merged", [90.0, 99.0])]
    printed += [row("raw_vllm", [120.0, 130.0]), "Traceback (most recent call last):"]  # cut in round 2
    (tmp_path / "run.log").write_text("\n".join(printed) + "\n")
    argv = ["bench.rollout", "--sides", "raw,ours", "--rounds", "2", "--rows", str(tmp_path / "run.log")]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("RLFT_BENCH_RESULTS", str(tmp_path / "results.jsonl"))
    rollout.main()
    assert "of 3 calls x 2/1 process(es) per side" in capsys.readouterr().out
    (line,) = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    result = line["result"]
    assert result["tokens_per_s"] == {"raw": 115.0, "ours": 94.5}  # raw: the median of its 4 calls
    assert result["ratios"]["ours_over_raw"] == round(94.5 / 115.0, 2)
    assert result["ratio_per_round"]["ours_over_raw"] == [round(94.5 / 105.0, 2)]  # round 1 only
    assert result["processes"] == {"raw": 2, "ours": 1}
    assert (line["commit"], line["date"], line["machine"]["gpu"]) == ("abc1234", "2026-12-08 01:24 UTC", "GPU")
    (tmp_path / "empty.log").write_text("nothing\n")
    monkeypatch.setattr(sys, "argv", ["bench.rollout", "--rows", str(tmp_path / "empty.log")])
    with pytest.raises(SystemExit, match="no row of bench.rollout"):
        rollout.main()


def test_sync_merge_arithmetic_runs_on_a_real_checkpoint(tiny_model):
    """`bench.sync --micro-only`'s measurement: the fp32 merge forms agree bit for bit on the model's projections."""
    from bench import sync

    row = sync.merge_math_micro(str(tiny_model), 4, 1)
    assert row["bit_identical"] and row["rank"] == 4 and row["actor_s"] > 0


def test_gpu_setup_names_what_is_missing_and_refuses_a_call_that_needs_it(tmp_path):
    """bench/gpu/setup.sh on a bare machine (nothing transferred): it writes the environment file, ends with the
    pieces still missing (vLLM until its seven parts are installed), and with `SETUP_REQUIRE` naming one of them
    exits 1 with a line that says which, so that a GPU call on a replaced machine stops before its work starts."""
    root = tmp_path / "root"
    work = tmp_path / "checkout"  # the script reads .whl/, .smol/, .vllm026/ from the folder it runs in
    work.mkdir()

    def setup(require: str) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "PY": sys.executable, "SETUP_ROOT": str(root), "SETUP_REQUIRE": require}
        script = REPO / "bench" / "gpu" / "setup.sh"
        return subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=120)

    ok = setup("")
    assert ok.returncode == 0, ok.stderr
    last = ok.stdout.strip().splitlines()[-1]
    assert last.startswith("setup: missing: ") and "vllm" in last.split(": ")[-1].split()
    assert f"PYTHONPATH={work}:{root}/site" in (root / "rlft-env.sh").read_text()

    refused = setup("ray vllm")
    assert refused.returncode == 1
    assert "setup: vllm is required (SETUP_REQUIRE) but missing on this machine" in refused.stderr


def test_gpu_distill_script_plans_three_roles_on_one_h200(tmp_path):
    """bench/gpu/distill_h200.sh's distillation run, planned for an H200 (PLAN_ONLY: nothing starts): its overrides
    compose into a valid config, the actor, the learner and the teacher engine share GPU 0 and fit it."""
    env = repo_env(PLAN_ONLY="1", PLAN_GPU_GIB="139", PY=sys.executable)
    script = REPO / "bench" / "gpu" / "distill_h200.sh"
    proc = subprocess.run(
        ["bash", str(script), str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "GPU 0: actor 0 (0.3), learner 0 (0.4), teacher 0 (0.3)" in proc.stdout
    assert "cluster.teacher_memory_utilization=0.2" in proc.stdout
    assert proc.stdout.rstrip().endswith("fits (by this estimate)")
    assert not (tmp_path / "out" / "teacher").exists()  # PLAN_ONLY: no run started
