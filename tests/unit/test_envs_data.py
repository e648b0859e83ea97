"""Dataset environments: chat-format jsonl, field mapping, GSM8K answers, one-line errors, shuffling, sharding, eval sets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from envs.data import DataEnv
from envs.hf import Source, final_answer
from envs.templates import BOXED_SYSTEM_PROMPT, PromptTemplate

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} (shared benchmark copies) is absent")


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def seed_rows(n: int) -> list[dict]:
    return [{"messages": {"role": "user", "content": f"What is {i} + 1?"}, "gt_answer": str(i + 1)} for i in range(n)]


def test_chat_format_jsonl_with_default_system_prompt(tmp_path):
    rows = seed_rows(3) + [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}], "gt_answer": 4}
    ]
    env = DataEnv(str(write_jsonl(tmp_path / "train.jsonl", rows)), shuffle=False)
    first, last = env.train_items()[0], env.train_items()[-1]
    assert first["messages"] == [
        {"role": "system", "content": BOXED_SYSTEM_PROMPT},
        {"role": "user", "content": "What is 0 + 1?"},
    ]
    assert first["answer"] == "1" and first["metadata"]["where"].endswith("train.jsonl:1")
    assert last["messages"][0]["content"] == "Be brief." and last["answer"] == "4"


def test_bad_json_line_names_file_and_line_or_is_skipped_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [*seed_rows(2), "{not json", *seed_rows(1)])
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: not JSON: Expecting property name .* at column 2") as err:
        DataEnv(str(path))
    assert "\n" not in str(err.value) and "line 1" not in str(err.value)  # the file's line, not json's own count
    cut = write_jsonl(tmp_path / "cut.jsonl", [*seed_rows(1), '{"answer": "1"'])
    with pytest.raises(ValueError, match=r"cut\.jsonl:2: not JSON: .* \(the line ends early\)"):
        DataEnv(str(cut))
    env = DataEnv(str(path), strict=False)
    assert len(env.train_items()) == 3 and env.skipped == 1


def test_missing_field_names_line_and_key(tmp_path):
    path = write_jsonl(tmp_path / "nofield.jsonl", [*seed_rows(1), {"messages": {"role": "user", "content": "hi"}}])
    with pytest.raises(ValueError, match=r"nofield\.jsonl:2: no answer field \(looked for gt_answer"):
        DataEnv(str(path))
    with pytest.raises(ValueError, match=r"nofield\.jsonl:1: missing field 'problem'"):
        DataEnv({"path": str(path), "prompt_field": "problem"})


def test_missing_field_error_gives_the_override_that_names_it(tmp_path):
    path = write_jsonl(tmp_path / "own.jsonl", [{"q": "What is 1 + 1?", "a": "2"}])
    with pytest.raises(ValueError, match=r"name it: 'env.eval_sets.mine=\{path: .*own\.jsonl, prompt_field: "):
        DataEnv(str(write_jsonl(tmp_path / "t.jsonl", seed_rows(2))), eval_sets={"mine": str(path)})
    env = DataEnv({"path": str(path), "prompt_field": "q", "answer_field": "a"})
    assert env.train_items()[0]["answer"] == "2"


def test_json_file_rows_must_be_objects_and_an_object_is_not_rows(tmp_path):
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps([*seed_rows(2), "oops", 5]))
    with pytest.raises(ValueError, match=r"mixed\.json item 2: a row must be a JSON object, got str"):
        DataEnv(str(mixed))
    env = DataEnv(str(mixed), strict=False)
    assert len(env.train_items()) == 2 and env.skipped == 2
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"data": seed_rows(2)}, indent=1))
    with pytest.raises(ValueError, match=r"wrapped\.json: one JSON object over several lines \(keys \['data'\]\)"):
        DataEnv(str(wrapped))
    lines = tmp_path / "lines.json"  # jsonl under a .json name still reads line by line
    write_jsonl(lines, seed_rows(3))
    assert len(DataEnv(str(lines)).train_items()) == 3


def test_empty_dataset_and_missing_file_fail_with_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"env\.train: .*empty\.jsonl has no usable rows"):
        DataEnv(str(write_jsonl(tmp_path / "empty.jsonl", [])))
    with pytest.raises(ValueError, match="no such file"):
        DataEnv(str(tmp_path / "absent.jsonl"))
    with pytest.raises(ValueError, match="unknown source key"):
        DataEnv({"path": "x.jsonl", "spilt": "test"})


def test_hub_id_without_datasets_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as on an install without `datasets`
    with pytest.raises(ValueError, match="needs the `datasets` package"):
        DataEnv({"path": "openai/gsm8k", "name": "main", "split": "test"})


def test_a_hub_dataset_that_does_not_load_names_the_keys_for_local_files(monkeypatch):
    """Offline (no network, not in the datasets cache) `datasets` raises its own errors; the line keeps their text
    and names env.train / env.eval_sets, which take local files."""
    datasets = pytest.importorskip("datasets")

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(ValueError) as e:
        DataEnv({"path": "openai/gsm8k", "name": "main", "split": "train"})
    line = str(e.value)
    assert line.startswith("'openai/gsm8k' (a Hugging Face Hub dataset) did not load (ConnectionError: Couldn't")
    assert "env.train" in line and "env.eval_sets" in line and "\n" not in line


@needs_data
def test_dataset_folder_loads_through_hf_datasets(tmp_path):
    """A Hub-style dataset folder (what `huggingface-cli download --repo-type dataset` leaves) goes through
    `datasets.load_dataset`, with GSM8K's field mapping, as `env=gsm8k` does for the Hub id."""
    pytest.importorskip("datasets")
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    lines = (DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[:12]
    (folder / "test.jsonl").write_text("\n".join(lines) + "\n")
    env = DataEnv({"path": str(folder), "split": "test"}, eval_sets={"held": {"path": str(folder), "split": "test"}})
    items = env.train_items()
    assert len(items) == 12
    golds = {json.loads(line)["answer"].rsplit("####", 1)[1].strip().replace(",", "") for line in lines}
    assert {it["answer"] for it in items} == golds
    assert all(it["messages"][-1]["role"] == "user" for it in items)


def test_answer_extraction_formats():
    assert final_answer("so 3 + 4 = 7\n#### 1,250", "auto", "row", "answer") == "1250"
    assert final_answer(r"so it is $\boxed{\frac{1}{2}}$.", "auto", "row", "solution") == r"\frac{1}{2}"
    assert final_answer(142.0, "auto", "row", "answer") == "142"
    with pytest.raises(ValueError, match="row: 'answer' has no '#### <answer>'"):
        final_answer("7", "gsm8k", "row", "answer")


def test_shuffle_and_shards_are_deterministic_and_disjoint(tmp_path):
    path = str(write_jsonl(tmp_path / "t.jsonl", seed_rows(20)))
    answers = lambda env: [it["answer"] for it in env.train_items()]  # noqa: E731
    assert answers(DataEnv(path, seed=3)) == answers(DataEnv(path, seed=3))
    assert answers(DataEnv(path, seed=3)) != answers(DataEnv(path, seed=4))
    shards = [answers(DataEnv(path, seed=3, num_shards=3, shard_index=k)) for k in range(3)]
    assert sorted(sum(shards, [])) == sorted(answers(DataEnv(path, seed=3)))
    with pytest.raises(ValueError, match="shard_index"):
        DataEnv(path, num_shards=2, shard_index=2)


def test_eval_sets_are_named_and_interleaved_and_holdout_is_disjoint(tmp_path):
    train = str(write_jsonl(tmp_path / "t.jsonl", seed_rows(10)))
    a = str(write_jsonl(tmp_path / "a.jsonl", seed_rows(3)))
    b = str(write_jsonl(tmp_path / "b.jsonl", seed_rows(1)))
    env = DataEnv(train, eval_sets={"eval_a": a, "eval_b": b})
    assert [it["metadata"]["eval_set"] for it in env.eval_items()] == ["eval_a", "eval_b", "eval_a", "eval_a"]
    held = DataEnv(train, eval_holdout=4)
    held_q = {it["metadata"]["question"] for it in held.eval_items() if it["metadata"]["eval_set"] == "holdout"}
    assert len(held_q) == 4 and not held_q & {it["metadata"]["question"] for it in held.train_items()}


def test_templates():
    assert PromptTemplate("plain").messages("q") == [{"role": "user", "content": "q"}]
    assert PromptTemplate("think_answer").messages("q")[0]["role"] == "system"
    assert PromptTemplate("boxed", system_prompt="").messages("q") == [{"role": "user", "content": "q"}]
    assert PromptTemplate("plain", user="Q: {prompt}\nA:").messages("2+2")[0]["content"] == "Q: 2+2\nA:"
    with pytest.raises(ValueError, match="template"):
        PromptTemplate("nope")


@needs_data
def test_shared_benchmarks_load_with_field_mapping():
    env = DataEnv(
        {"path": str(DATA / "gsm8k/test.jsonl")},
        shuffle=False,
        eval_sets={
            "math500": str(DATA / "math500/test.jsonl"),
            "amc": str(DATA / "amc/test.jsonl"),
            "aime24": str(DATA / "aime24/test.jsonl"),
        },
    )
    assert len(env.train_items()) == 1319 and env.train_items()[0]["answer"] == "18"
    sets = [it["metadata"]["eval_set"] for it in env.eval_items()]
    assert {k: sets.count(k) for k in set(sets)} == {"math500": 500, "amc": 83, "aime24": 30}
    assert env.eval_items()[0]["answer"] == r"\left( 3, \frac{\pi}{2} \right)"  # math500's first, interleaved
    assert Source.of({"path": "openai/gsm8k", "name": "main"}, "env.train").is_local is False


def test_env_configs_compose_and_build(tmp_path):
    """conf/env/jsonl.yaml builds through Hydra like train.py does; the hub configs compose."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rl.config.schema import register_configs

    register_configs()
    conf = str(Path(__file__).resolve().parents[2] / "conf")
    train = write_jsonl(tmp_path / "t.jsonl", seed_rows(4))
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(
            config_name="train", overrides=["env=jsonl", f"env.train={train}", f"+env.eval_sets={{e1:{train}}}"]
        )
        for name in ("gsm8k", "math500", "chain_sum"):
            assert compose(config_name="train", overrides=[f"env={name}"]).env._target_
    env = instantiate(cfg.env, _convert_="all")
    assert len(env.train_items()) == 4 and len(env.eval_items()) == 4


def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    rows = "".join(json.dumps(r) + "\n" for r in seed_rows(2))
    for name, text in (("bom.jsonl", rows), ("bom.json", json.dumps(seed_rows(2)))):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert len(DataEnv(str(path)).train_items()) == 2
