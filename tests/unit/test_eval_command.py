"""`python -m rl.tools.eval` without an engine: its config (conf/eval.yaml), the four kinds of trained policy it reads
(rl/loop/checkpoint.py find_policy), its resolved config, its table and its choice of eval sets. The engine runs in
tests/integration/test_eval_command.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from rl.config.schema import ConfigError
from rl.loop import checkpoint
from rl.tools.eval import compose, format_table, policy_config, resolve_eval, select_items
from rl.types import Adapter, TrainedPolicy
from tests.helpers import REPO


def adapter_folder(folder, rank=8):
    checkpoint.write_adapter(Adapter(3, {"r": rank, "lora_alpha": 16, "target_modules": ["q_proj"]}, b"w"), folder)
    return folder


def test_eval_yaml_keeps_the_training_groups_of_train_yaml():
    """The same defaults list as train.yaml (with the eval schema): a run's overrides evaluate it as trained."""
    groups = lambda name: [d for d in OmegaConf.load(REPO / "conf" / name).defaults if isinstance(d, dict)]  # noqa: E731
    assert groups("eval.yaml") == groups("train.yaml")


def test_find_policy_reads_the_four_layouts(tmp_path):
    folder = adapter_folder(tmp_path / "a")
    assert checkpoint.find_policy(folder) == TrainedPolicy("adapter", adapter=folder)

    run = tmp_path / "run"
    adapter = Adapter(3, {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}, b"w")
    ckpt = checkpoint.save(run, 4, learner_state={"adapter": adapter}, trainer_state={})  # a whole checkpoint
    assert checkpoint.find_policy(ckpt) == TrainedPolicy("checkpoint", adapter=ckpt / "adapter")
    # a run stopped before its result export: its latest checkpoint; with the export: the export
    assert checkpoint.find_policy(run) == TrainedPolicy("run", adapter=ckpt / "adapter")
    adapter_folder(run / "adapter")
    assert checkpoint.find_policy(run) == TrainedPolicy("run", adapter=run / "adapter")

    full = tmp_path / "full"
    (full / "model").mkdir(parents=True)
    (full / "model" / "config.json").write_text("{}")
    assert checkpoint.find_policy(full) == TrainedPolicy("run", model=full / "model")
    assert checkpoint.find_policy(full / "model") == TrainedPolicy("model", model=full / "model")

    loaded = checkpoint.read_adapter(folder, version=1)
    assert (loaded.version, loaded.config["r"], loaded.weights) == (1, 8, b"w")


@pytest.mark.parametrize("make", ["missing", "empty", "file"])
def test_a_path_that_is_no_policy_is_one_line_naming_the_key(tmp_path, make):
    path = tmp_path / "x"
    if make == "empty":
        path.mkdir()
    elif make == "file":
        path.write_text("not a model")
    with pytest.raises(ConfigError) as e:
        checkpoint.find_policy(path)
    msg = str(e.value)
    assert msg.startswith(f"adapter={path}: ") and "\n" not in msg
    assert "run directory" in msg and "checkpoint" in msg


def test_eval_config_composes_every_training_group_and_checks_its_keys():
    _, cfg = compose(["model=qwen2.5-0.5b", "algorithm=dapo", "env=gsm8k", "eval.n_samples=8", "adapter=/x"])
    assert (cfg.model.path, cfg.algorithm.name, cfg.env["_target_"]) == (
        "Qwen/Qwen2.5-0.5B-Instruct",
        "dapo",
        "envs.data.DataEnv",
    )
    assert (cfg.adapter, cfg.eval.n_samples, cfg.compare_base) == ("/x", 8, True)
    with pytest.raises(SystemExit):  # one line on stderr, as train.py
        compose(["compare_base=false"])


def test_resolve_eval_adds_n_to_pass_k_and_sizes_lora_slots_for_the_adapter(tmp_path):
    _, cfg = compose(["eval.n_samples=8", "eval.pass_k=[4]", "model.lora_rank=8", "cluster.lora_mode=native"])
    policy = TrainedPolicy("adapter", adapter=adapter_folder(tmp_path / "a", rank=32))
    resolved = resolve_eval(cfg, tmp_path / "out", policy, model_path="/m")
    assert resolved.eval.pass_k == [1, 4, 8] and resolved.eval.n_samples == 8 and resolved.eval.temperature == 1.0
    assert resolved.model.lora_rank == 32 and resolved.model.path == "/m" and not resolved.model.full_finetune
    assert resolved.eval.save_dir == str(tmp_path / "out") and resolved.compare_base
    base_only = resolve_eval(cfg, tmp_path / "out", None, model_path="/m")
    assert base_only.adapter is None and base_only.compare_base and base_only.model.lora_rank == 8


def test_an_hf_model_folder_is_the_weights_its_engine_loads_not_the_base(tmp_path):
    """resolve fills model.actor_path with the base's path and the engines load actor_path: a full fine-tune's
    model/ export must replace it too, else the "trained" column is the base model again."""
    _, cfg = compose([])
    resolved = resolve_eval(cfg, tmp_path / "out", None, model_path="/base")
    assert resolved.model.actor_path == "/base"
    trained = policy_config(resolved, TrainedPolicy("run", model=tmp_path / "run" / "model"))
    assert trained.model.actor_path == trained.model.path == str(tmp_path / "run" / "model")
    adapter = TrainedPolicy("adapter", adapter=adapter_folder(tmp_path / "a"))
    assert policy_config(resolved, adapter) == resolved  # an adapter is loaded into the base's engine


def test_table_puts_base_and_trained_side_by_side_with_avg_and_pass_at_k():
    base = {"eval/accuracy": 0.25, "eval/pass@1": 0.2, "eval/pass@8": 0.5, "eval/a/accuracy": 0.5, "eval/n": 4.0}
    trained = {"eval/accuracy": 0.75, "eval/pass@1": 0.6, "eval/pass@8": 0.9, "eval/a/accuracy": 1.0, "eval/n": 4.0}
    lines = format_table({"base": base, "trained": trained}, 8).splitlines()
    assert lines[0].split() == ["eval", "set", "metric", "base", "trained", "delta"]
    rows = [ln.split() for ln in lines[2:]]
    assert rows[0] == ["all", "greedy", "accuracy", "0.250", "0.750", "+0.500"]
    assert rows[1] == ["all", "avg@8", "(pass@1)", "0.200", "0.600", "+0.400"]
    assert rows[2] == ["all", "pass@8", "0.500", "0.900", "+0.400"]
    assert rows[3] == ["a", "greedy", "accuracy", "0.500", "1.000", "+0.500"]
    assert format_table({"trained": trained}, 8).splitlines()[0].split()[-1] == "trained"


def test_select_items_keeps_the_named_sets_and_names_the_ones_there_are():
    items = [{"metadata": {"eval_set": s}, "i": i} for i, s in enumerate("abab")]
    assert [it["i"] for it in select_items(items, ["b"], 10)] == [1, 3]
    assert [it["i"] for it in select_items(items, [], 3)] == [0, 1, 2]
    with pytest.raises(ConfigError, match=r"eval_only=\['c'\]: no eval set named c; the env has: a, b"):
        select_items(items, ["c"], 10)


def test_results_json_is_written_whole(tmp_path):
    from rl.tools.eval import write_results

    _, cfg = compose([])
    resolved = resolve_eval(cfg, tmp_path, None, model_path="/m")
    path = write_results(resolved, {"base": {"eval/accuracy": 0.5}}, "table", ["env=chain_sum"])
    doc = json.loads(path.read_text())
    assert doc["command"] == "python -m rl.tools.eval env=chain_sum" and doc["metrics"]["base"]["eval/accuracy"] == 0.5
    assert (doc["model"], doc["policy"]) == ("/m", None)
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


@pytest.mark.parametrize("make", ["file", "under_a_file", "holding_results"])
def test_an_eval_out_it_cannot_write_is_one_line_before_any_engine_starts(tmp_path, make):
    (tmp_path / "f").write_text("")
    out = {"file": tmp_path / "f", "under_a_file": tmp_path / "f" / "sub", "holding_results": tmp_path}[make]
    cmd = [sys.executable, "-m", "rl.tools.eval", "eval.size=2", f"eval_out={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: eval_out={out}")
    assert (tmp_path / "f").read_text() == ""  # an earlier evaluation's (or anyone's) files stay as they were


def test_a_dataset_env_without_eval_sets_names_them_not_the_prompt_length(tiny_model, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    cmd = [sys.executable, "-m", "rl.tools.eval", f"model.path={tiny_model}", "env=jsonl", f"env.train={train}"]
    proc = subprocess.run(
        [*cmd, "reward=boxed", "eval.size=2", f"eval_out={tmp_path / 'out'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: the env gives no eval prompts: a dataset env (env=jsonl, gsm8k, math500) evaluates on "
        "env.eval_sets={name: file} or env.eval_holdout=N training items"
    ], proc.stderr[-2000:]
