"""bench/e2e_unsloth.py on the CPU: both sides get one step's work from one Work object (our train.py overrides, as
Hydra composes them, against Unsloth's model, LoRA and GRPOConfig keywords), our layouts at 7B plan to fit an
H100, the shape's folder is built once, the device memory sampler keeps the peak, the report pools the steps and
appends the comparison under its claim, and the GPU call script reports and hands its rows back. What only a GPU
runs (Unsloth's fast_inference, vLLM, the timings) is bench/gpu/e2e_unsloth.sh's."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from bench import e2e_unsloth
from bench.e2e_trl import LOSS_AGG
from tests.helpers import CONF, REPO, repo_env, run_train


def default_work(*argv: str):
    return e2e_unsloth.work_of(e2e_unsloth.parser().parse_args(list(argv)))


@pytest.fixture(scope="module")
def qwen7b_shape(tmp_path_factory):
    """The 7B shape's config.json alone (no weights): what composing and planning read."""
    from bench.shapes import shape_config

    folder = tmp_path_factory.mktemp("qwen2.5-7b")
    cfg = shape_config("qwen2.5-7b", vocab_size=32000)
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(folder)
    return folder


def composed(overrides: list[str]):
    """The typed config train.py builds from these overrides (Hydra's groups and the experiment included; its own
    `hydra.*` keys left out), the schema's checks run."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rl.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[o for o in overrides if not o.startswith("hydra.")])
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize("layout", ["split", "colocate"])
def test_both_sides_get_the_same_work_from_one_work_object(layout, qwen7b_shape, tmp_path):
    work = default_work()
    assert (work.prompts, work.G, work.max_new, work.micro) == (32, 8, 512, 32)  # the preset
    cfg = composed(e2e_unsloth.ours_args(layout, work, qwen7b_shape, tmp_path / "run", 5, None))
    grpo = e2e_unsloth.unsloth_grpo_config(work, 5, tmp_path / "unsloth")
    model = e2e_unsloth.unsloth_model_kwargs(work, str(qwen7b_shape), 0.5)
    lora = e2e_unsloth.unsloth_lora_kwargs(work)
    m, a = cfg.model, cfg.algorithm
    assert (
        cfg.run.prompts_per_step * a.group_size
        == grpo["per_device_train_batch_size"] * grpo["gradient_accumulation_steps"]
    )
    assert a.group_size == grpo["num_generations"]
    assert m.max_new_tokens == grpo["max_completion_length"]
    assert m.max_prompt_tokens + m.max_new_tokens == model["max_seq_length"]
    assert cfg.learner.micro_batch_size == grpo["per_device_train_batch_size"]
    assert (m.lora_rank, m.lora_alpha, m.lora_dropout) == (lora["r"], lora["lora_alpha"], lora["lora_dropout"])
    assert m.lora_rank == model["max_lora_rank"]
    assert list(m.lora_targets) == lora["target_modules"]
    assert (a.kl_coef, a.lr, a.loss_agg) == (grpo["beta"], grpo["learning_rate"], LOSS_AGG[grpo["loss_type"]])
    assert (a.temperature, a.top_p) == (grpo["temperature"], grpo["top_p"])
    assert (a.weight_decay, a.max_grad_norm) == (grpo["weight_decay"], grpo["max_grad_norm"])
    assert a.kl_estimator.value == "k3" and not a.kl_in_reward  # TRL's KL: k3, in the loss
    assert a.updates_per_step == 1  # as TRL's num_iterations=1: one optimizer step per generation batch
    assert a.clip_low == a.clip_high == grpo["epsilon"] and a.tis_cap == 0
    assert not grpo["vllm_importance_sampling_correction"]  # no extra forward on either side
    # both learners: Unsloth, 4-bit, its offloaded gradient checkpointing; Unsloth's engine in its process
    assert (m.learner_backend.value, m.load_in_4bit, m.gradient_checkpointing) == ("unsloth", True, None)
    assert model["load_in_4bit"] and model["fast_inference"] and lora["use_gradient_checkpointing"] == "unsloth"
    assert grpo["use_vllm"] and grpo["vllm_mode"] == "colocate"
    assert m.path == str(qwen7b_shape) == model["model_name"]
    assert cfg.cluster.colocate == (layout == "colocate")
    assert cfg.cluster.gpus_per_actor == (0.5 if layout == "split" else 1)


def test_actor_memory_replaces_the_layouts_share(tmp_path, qwen7b_shape):
    args = e2e_unsloth.ours_args("split", default_work(), qwen7b_shape, tmp_path, 5, 0.4)
    assert [a for a in args if a.startswith("cluster.gpu_memory_utilization=")] == [
        "cluster.gpu_memory_utilization=0.4"
    ]


def test_unsloth_grpo_config_is_one_trl_accepts(tmp_path):
    """TRL's own GRPOConfig (Unsloth's subclass adds fields, none of these) takes the keywords and makes one
    generation batch of the step's completions per optimizer step. TRL is in requirements-bench.txt only."""
    trl = pytest.importorskip("trl")
    work = default_work()
    cfg = trl.GRPOConfig(**e2e_unsloth.unsloth_grpo_config(work, 5, tmp_path), use_cpu=True)
    assert cfg.generation_batch_size == work.prompts * work.G
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps == work.prompts * work.G // work.micro


@pytest.mark.parametrize("layout", ["split", "colocate"])
def test_our_layouts_at_7b_plan_to_fit_an_h100(layout, qwen7b_shape, tmp_path):
    """Each of our sides at the issue's work and the 7B shape is a valid run that `plan=true` fits on one GPU of
    an H100's 80 GiB (the smaller card the GPU machine may be); the engine's KV cache holds the whole batch."""
    args = e2e_unsloth.ours_args(layout, default_work(), qwen7b_shape, tmp_path / "run", 5, None)
    proc = run_train([*args, "plan=true", "plan_gpu_memory_gib=80"], timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "WARNING" not in proc.stdout and proc.stdout.rstrip().endswith("fits (by this estimate)"), proc.stdout
    assert "256 sequences x 768 = 196,608 tokens at once" in proc.stdout


def test_arguments_set_the_work_and_refuse_what_cannot_run(monkeypatch, capsys):
    small = default_work("--prompts", "4", "--n", "2", "--max-tokens", "16")
    assert (small.prompts, small.G, small.max_new, small.micro) == (4, 2, 16, 8)  # one micro-batch of all 8
    for argv, message in ((["--sides", "unsloth,spilt"], "--sides: unknown ['spilt']"), (["--prompts", "5"], "--n")):
        monkeypatch.setattr(sys, "argv", ["bench.e2e_unsloth", *argv])
        with pytest.raises(SystemExit, match="--prompts|--sides") as done:
            e2e_unsloth.main()
        assert message in str(done.value)


def test_the_shape_folder_is_built_once(tmp_path):
    folder = e2e_unsloth.model_folder("tiny", tmp_path, device="cpu")
    assert folder == tmp_path / "tiny-v32000"
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    built = (folder / "model.safetensors").stat().st_mtime_ns
    assert e2e_unsloth.model_folder("tiny", tmp_path, device="cpu") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == built


def test_device_peak_keeps_the_highest_reading():
    readings = iter([1.0, 5.0, 3.0, 2.0])
    done = threading.Event()

    def query():
        value = next(readings, None)
        if value is None:
            done.set()
        return value

    with e2e_unsloth.DevicePeak(query, every=0.001) as peak:
        done.wait()
    assert (peak.base, peak.peak) == (1.0, 5.0)
    with e2e_unsloth.DevicePeak(lambda: None) as none:  # no nvidia-smi: no reading, no thread
        pass
    assert (none.base, none.peak) == (None, None)


def test_a_run_takes_the_next_number_no_earlier_run_used(tmp_path, monkeypatch):
    """A cut run left `split-2/` and no row: the next split run is 3, its row split-3.json; Unsloth's numbers are
    its own."""
    (tmp_path / "split-1.json").write_text("{}")
    (tmp_path / "split-2").mkdir()
    (tmp_path / "unsloth-4.log").write_text("")
    ran = []

    def fake_ours(layout, work, model, run, args):
        ran.append(run.name)
        return {"step_s": [1.0]}

    monkeypatch.setattr(e2e_unsloth, "run_ours", fake_ours)
    monkeypatch.setattr(e2e_unsloth, "machine_info", dict)
    args = e2e_unsloth.parser().parse_args([])
    row = e2e_unsloth.run_side("split", default_work(), tmp_path, tmp_path, args)
    assert ran == ["split-3"] and row["repeat"] == 3 and (tmp_path / "split-3.json").is_file()


def fake_row(side: str, k: int, steps: list[float], gpu: str = "NVIDIA H100 80GB HBM3") -> dict:
    machine = {"host": "h", "cpus": 16, "gpu": gpu, "load_avg": [0.1], "date": "2026-12-06 10:00 UTC", "commit": ""}
    return {
        "side": side,
        "repeat": k,
        "step_s": steps,
        "startup_s": 100.0,
        "device_peak_gib": 60.0,
        "torch_peak_gib": 20.0,
        "kv_cache_tokens": 500000,
        "completion_tokens_mean": [512.0] * len(steps),
        "machine": machine,
    }


def write_rows(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        (folder / f"{row['side']}-{row['repeat']}.json").write_text(json.dumps(row))
    (folder / "unsloth-1.child.json").write_text("{}")  # a child's own result file is no row


def test_report_pools_the_steady_steps_and_appends_the_comparison(tmp_path, monkeypatch, capsys):
    work = default_work()
    rows = e2e_unsloth.rows_folder(tmp_path / "out", "qwen2.5-7b", work)
    assert rows.name == "qwen2.5-7b-32x8x512"
    write_rows(rows, [fake_row("unsloth", 1, [90, 40, 44]), fake_row("unsloth", 2, [80, 36, 40])])
    assert e2e_unsloth.report(rows, "qwen2.5-7b", work)["ratios"] == {}
    assert "no ratio yet" in capsys.readouterr().out
    write_rows(rows, [fake_row("split", 1, [30, 20, 22]), fake_row("colocate", 1, [30, 24, 25])])
    summary = e2e_unsloth.report(rows, "qwen2.5-7b", work)
    unsloth = summary["sides"]["unsloth"]
    assert unsloth["step_s"] == {"median": 40.0, "min": 36, "max": 44, "n": 4}  # steps 2..N of both runs
    assert unsloth["samples_per_s"]["median"] == 256 / 40.0
    assert summary["ratios"]["split"] == {"ours_over_unsloth": 1.9, "bounds": [1.64, 2.2]}
    table = capsys.readouterr().out
    assert "| split (NVIDIA H100 80GB HBM3, 1 runs) |" in table and "**1.90x** (1.64-2.20)" in table

    results = tmp_path / "results.jsonl"
    monkeypatch.setenv("RLFT_BENCH_RESULTS", str(results))
    argv = ["bench.e2e_unsloth", "--shape", "qwen2.5-7b", "--out", str(tmp_path / "out"), "--report-only"]
    monkeypatch.setattr(sys, "argv", argv)
    e2e_unsloth.main()
    line = json.loads(results.read_text())
    assert line["claim"] == "e2e-unsloth-7b" and line["bench"] == "e2e_unsloth"
    assert line["machine"]["gpu"] == "NVIDIA H100 80GB HBM3" and line["result"]["ratios"]["colocate"]


def test_gpu_script_reports_the_rows_and_hands_them_back(tmp_path):
    """bench/gpu/e2e_unsloth.sh's bookkeeping, without a GPU: `report` prints the rows' table and copies rows and
    logs (not weights) under $OUT; an unknown side stops it with its usage line."""
    rows = tmp_path / "rows"
    folder = rows / "qwen2.5-0.5b-32x8x512"
    write_rows(folder, [fake_row("unsloth", 1, [9, 4, 4]), fake_row("split", 1, [5, 2, 2])])
    (folder / "split-1" / "logs").mkdir(parents=True)
    (folder / "split-1" / "logs" / "actor0.log").write_text("KV cache size: 1,000 tokens\n")
    (folder / "split-1" / "adapter.safetensors").write_bytes(b"weights")
    env = repo_env(ROWS=str(rows), OUT=str(tmp_path / "out"), PY=sys.executable)
    script = str(REPO / "bench" / "gpu" / "e2e_unsloth.sh")

    def call(*argv):
        return subprocess.run(["bash", script, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    done = call("qwen2.5-0.5b", "report")
    assert done.returncode == 0, done.stderr
    assert "**2.00x** (2.00-2.00)" in done.stdout
    back = tmp_path / "out" / "e2e-unsloth" / "qwen2.5-0.5b-32x8x512"
    assert (back / "split-1.json").is_file() and (back / "split-1" / "logs" / "actor0.log").is_file()
    assert not (back / "split-1" / "adapter.safetensors").exists()
    refused = call("qwen2.5-0.5b", "splt")
    assert refused.returncode == 2 and "usage: bash bench/gpu/e2e_unsloth.sh" in refused.stderr
