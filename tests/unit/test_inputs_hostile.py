"""Hostile inputs fail at start with one line naming what to fix: config values that are NaN, infinite or
impossible (the schema's groups and the env/reward `_target_` arguments), and data files that cannot be read
(another encoding, bytes that are not UTF-8, deep nesting, non-standard JSON, lone surrogates); with
env.strict=false an unreadable line or file is skipped and counted instead."""

from __future__ import annotations

import codecs
import dataclasses
import json
import re
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envs.data import DataEnv
from rl.config.errors import ConfigError
from rl.config.schema import TrainConfig, register_configs
from rl.data.demos import read_demos
from rl.entry import build_target, compose_config
from tests.helpers import REPO, typed_config

register_configs()


def is_float(hint: object) -> bool:
    return hint is float or (typing.get_origin(hint) is not list and float in typing.get_args(hint))


def float_keys() -> list[str]:
    """Every float setting of the schema (`float` or `float | None`), as `group.field` (a top-level one as `field`)."""
    keys = []
    for top, group in typing.get_type_hints(TrainConfig).items():
        if dataclasses.is_dataclass(group):
            keys += [f"{top}.{k}" for k, t in typing.get_type_hints(group).items() if is_float(t)]
        elif is_float(group):
            keys.append(top)
    return keys


def test_the_float_settings_are_found():
    keys = float_keys()
    assert {"run.sync_probe_threshold", "eval.correct_threshold", "algorithm.lr", "plan_gpu_memory_gib"} <= set(keys)
    assert len(keys) > 30


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", float_keys())
def test_every_float_setting_refuses_nan_and_infinity_naming_its_key(key, value):
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}\b") as err:  # sandbox.*: its own ValueError
        typed_config(**{key: value})
    assert "\n" not in str(err.value)


def test_a_list_of_floats_refuses_infinity_naming_its_item():
    with pytest.raises(ConfigError, match=r"^algorithm\.filter_range\[1\]=inf is not a usable number"):
        typed_config(**{"algorithm.filter_range": "[0.1,.inf]"})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model.lora_alpha", 0),
        ("algorithm.adv_eps", 0.0),
        ("algorithm.weight_decay", -0.1),
        ("algorithm.overlong_penalty_factor", -1.0),
        ("algorithm.task_reward_coef", -1.0),
        ("run.seed", -1),
        ("run.seed", 2**32),
        ("run.sync_probe_threshold", 0.0),
        ("run.probe_floor_limit", -0.1),
        ("cluster.gpus_per_actor", 0.0),
        ("cluster.gpus_per_teacher", -1.0),
        ("cluster.cpus_per_learner", -1.0),
        ("cluster.actor_threads", 0),
        ("cluster.learner_threads", -2),
        ("cluster.ray_num_cpus", 0),
    ],
)
def test_impossible_counts_and_sizes_name_their_key(key, value):
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)} must be"):
        typed_config(**{key: value})


def build(overrides: list[str], key: str, capsys) -> str:
    """The one error line `build_target` exits with for the composed node `key`."""
    cfg = compose_config(str(REPO / "conf"), "train", overrides, TrainConfig)
    with pytest.raises(SystemExit) as done:
        build_target(cfg[key], key)
    assert done.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ")
    return err


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("reward.timeout_s=nan", "reward.timeout_s=nan"),  # NaN made the runner's deadline never pass
        ("reward.timeout_s=inf", "reward.timeout_s=inf"),
        ("reward.reward.extract=first", "reward.reward: could not build rewards.reasoning_gym.ReasoningGymScore"),
        ("reward.timeout_s=0", "reward.timeout_s must be"),
    ],
)
def test_reward_arguments_are_checked_before_the_run_starts(override, named, capsys):
    assert named in build([override], "reward", capsys)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["reward=boxed", "reward.reward.correct_score=nan"], "reward.reward.correct_score=nan"),
        (["reward=boxed", "reward.reward.timeout_s=-1"], "reward.timeout_s must be > 0"),
        (["reward=boxed", "reward.reward.max_answer_chars=0"], "reward.max_answer_chars must be >= 1"),
        (["reward=format_strict", "reward.reward.score=inf"], "reward.reward.score=inf"),
        (["reward=boxed_format", "reward.reward.terms.0.weight=nan"], "reward.reward.terms[0].weight=nan"),
        (["reward=judge", "reward.high=inf"], "reward.high=inf"),
        (["reward=judge", "reward.labels={correct: 2}"], "reward.labels must map"),
    ],
)
def test_every_reward_option_checks_its_numbers(overrides, named, capsys):
    assert named in build(overrides, "reward", capsys)


def rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]


def write(path: Path, lines: list[bytes | dict]) -> Path:
    path.write_bytes(b"\n".join(json.dumps(x).encode() if isinstance(x, dict) else x for x in lines) + b"\n")
    return path


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("env.eval_holdout=-1", "env.eval_holdout must be >= 0"),  # trained on one item, evaluated on the rest
        ("env.num_shards=0", "env.shard_index=0 must be in [0, env.num_shards=0)"),
        ("+env.train.limit=-1", "env.train.limit must be a number of rows >= 1"),
    ],
)
def test_env_arguments_are_checked_before_the_run_starts(override, named, tmp_path, capsys):
    path = write(tmp_path / "train.jsonl", rows(4))
    train = f"env.train={path}" if not override.startswith("+env.train") else f"env.train={{path: {path}}}"
    assert named in build(["env=jsonl", train, override], "env", capsys)


def test_reasoning_gym_env_sizes_are_checked(capsys):
    assert "env.size must be >= 1" in build(["env.size=0"], "env", capsys)


UTF16 = codecs.BOM_UTF16_LE + '{"question": "1+1?", "answer": "2"}\n'.encode("utf-16-le")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"question": "caf\xe9?", "answer": "1"}', r"not UTF-8 text \(byte 0xe9 at column 18\)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", r"not UTF-8 text \(byte 0x89 at column 1\)"),  # a binary file
        (b'{"question": "1?", "answer": NaN}', r"NaN is not standard JSON"),
        (b'{"question": "1?", "answer": -Infinity}', r"-Infinity is not standard JSON"),
        (b'{"question": "1?", "answer": "1", "answer": "2"}', r"key 'answer' appears twice"),
        (b'{"question": "\\ud800?", "answer": "1"}', r"lone surrogate \(\\ud800"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", r"nested deeper than"),
        ('{"q": 1}'.encode("utf-16-le"), r"NUL bytes, as UTF-16 text read as UTF-8 does"),
    ],
    ids=["latin-1", "binary", "nan", "infinity", "duplicate-key", "surrogate", "deep", "utf16-no-bom"],
)
def test_an_unreadable_line_is_named_with_its_cause_or_skipped(line, why, tmp_path):
    path = write(tmp_path / "train.jsonl", [*rows(2), line, *rows(1)])
    with pytest.raises(ValueError, match=rf"train\.jsonl:3: .*{why}") as err:
        DataEnv(str(path))
    assert "\n" not in str(err.value)
    env = DataEnv(str(path), strict=False)
    assert len(env.train_items()) == 3 and env.skipped >= 1


def test_a_file_in_another_encoding_is_named_or_skipped(tmp_path):
    for name in ("train.jsonl", "train.json"):
        path = tmp_path / name
        path.write_bytes(UTF16)
        with pytest.raises(ValueError, match=rf"{name}:1: the file is UTF-16 text .*save it as UTF-8"):
            DataEnv(str(path))
        with pytest.raises(ValueError, match=r"has no usable rows \(1 skipped as unreadable"):
            DataEnv(str(path), strict=False)


def test_a_json_document_names_the_line_or_item_at_fault(tmp_path):
    doc = tmp_path / "train.json"
    doc.write_bytes(b'[\n{"question": "1?", "answer": "1"},\n{"question": "caf\xe9", "answer": "2"}\n]\n')
    with pytest.raises(ValueError, match=r"train\.json:3: not UTF-8 text \(byte 0xe9 at column 18\)"):
        DataEnv(str(doc))
    doc.write_text('[{"question": "1?", "answer": "1"}, {"question": "2?", "answer": NaN}]')
    with pytest.raises(ValueError, match=r"train\.json item 1: NaN is not standard JSON"):
        DataEnv(str(doc))
    assert len(DataEnv(str(doc), strict=False).train_items()) == 1
    doc.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"train\.json: not JSON this reader can follow"):
        DataEnv(str(doc))


def test_a_broken_parquet_file_is_one_line_or_skipped(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=r"train\.parquet: not a parquet file pyarrow can read"):
        DataEnv(str(path))
    with pytest.raises(ValueError, match=r"no usable rows \(1 skipped"):
        DataEnv(str(path), strict=False)


def test_the_demonstrations_reader_names_the_line_of_the_same_faults(tmp_path):
    good = {"prompt": [{"role": "user", "content": "1+1?"}], "messages": [{"role": "assistant", "content": "2"}]}
    for line, why in [
        (b'{"prompt": "\xff"}', "not UTF-8 text"),
        (b'{"prompt": [], "prompt": []}', "appears twice"),
        (b'{"prompt": [{"role": "user", "content": "\\udfff"}], "messages": []}', "lone surrogate"),
        (b"[" * 100_000, "nested deeper than"),
    ]:
        path = write(tmp_path / "demos.jsonl", [good, line])
        with pytest.raises(ConfigError, match=rf"^algorithm\.demos=.*demos\.jsonl, line 2: .*{why}"):
            read_demos(path)
    with pytest.raises(ConfigError, match="no such file"):
        read_demos(tmp_path / "absent.jsonl")


def test_a_lone_surrogate_never_reaches_the_tokenizer(tmp_path):
    """The prompt `\\ud83d` (half of an emoji's pair) would end in a tokenizer traceback; it is refused with its line."""
    path = write(tmp_path / "train.jsonl", [b'{"question": "smile \\ud83d", "answer": "1"}', *rows(1)])
    with pytest.raises(ValueError, match=r"train\.jsonl:1: a string holds a lone surrogate"):
        DataEnv(str(path))
    pair = write(tmp_path / "pair.jsonl", [b'{"question": "smile \\ud83d\\ude00", "answer": "1"}'])
    assert DataEnv(str(pair)).train_items()[0]["metadata"]["question"] == "smile \U0001f600"


def test_the_composed_default_config_passes_every_check():
    cfg = OmegaConf.to_object(compose_config(str(REPO / "conf"), "train", [], TrainConfig))
    assert isinstance(cfg, TrainConfig)
