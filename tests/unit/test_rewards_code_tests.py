"""reward=code_tests (rewards/code_tests.py), its hacking-gate suite (rewards/check_code.py) and env=code_tasks
(envs/code_tasks.py): real programs run in the real sandbox."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from envs.code_tasks import FAMILIES, CodeTasksEnv, make_item
from rewards.check import build_reward, run_check
from rewards.check_code import CODE_EXPLOITS, CODE_PROBLEMS
from rewards.code_tests import CodeTestsReward, extract_code, parse_results, same_value

LIMITS = {"cpu_s": 1, "wall_s": 2, "memory_mb": 256, "max_output_bytes": 8192, "workers": 2}


@pytest.fixture(scope="module")
def reward():
    return CodeTestsReward(LIMITS)


def item(name: str = "rotate_left", params: dict | None = None) -> dict:
    fam = next(f for f in FAMILIES if f.name == name)
    return make_item(fam, params or {"k": 2, "d": 0}, random.Random(0), 6)


def test_extract_code_takes_the_last_fenced_block_or_the_whole_text():
    assert extract_code("a\n```python\nx = 1\n```\nb\n```py\ny = 2\n```\n") == "y = 2\n"
    assert extract_code("```\nz = 3\n```") == "z = 3\n"
    assert extract_code("text\n```python\nw = 4\n") == "w = 4\n"  # cut off before its closing fence
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"


def test_same_value_is_strict_about_kinds_and_tolerant_about_float_rounding():
    assert same_value([1, [2.0, "a"]], [1, [2, "a"]]) and same_value(0.1 + 0.2, 0.3)
    assert not same_value(True, 1) and not same_value(1, True) and not same_value("1", 1)
    assert not same_value([1, 2], [1, 2, 3]) and not same_value({"a": 1}, {"a": 1, "b": 2})
    assert not same_value(None, 0) and same_value(None, None)


def test_parse_results_keeps_the_first_report_of_each_index():
    from rewards.code_tests import MARK

    out = f"noise\n{MARK}[0, 5]\n{MARK}[0, 6]\n{MARK}[9, 1]\n{MARK}not json\n{MARK}[1, [1, 2]]\n"
    assert parse_results(out, 2) == {0: 5, 1: [1, 2]}


def test_correct_partial_and_wrong_code(reward):
    it = item()
    right = f"```python\n{it['answer']}```"
    # right only when the list has fewer than 3 elements or happens to rotate to itself: some tests, not all
    partial = "```python\ndef rotate_left(items):\n    return items if len(items) < 3 else items[2:]\n```"
    wrong = "```python\ndef rotate_left(items):\n    return items[::-1] + [0]\n```"
    scores = reward([right, partial, wrong, "no code at all"], answer=[it["answer"]] * 4, metadata=[it["metadata"]] * 4)
    assert scores[0] == 1.0 and 0 < scores[1] < 1 and scores[2] == 0 and scores[3] == 0
    n = len(it["metadata"]["tests"])
    assert scores[1] * n == pytest.approx(round(scores[1] * n))  # a pass fraction of the item's tests
    metrics = reward.pop_metrics()
    assert metrics["reward/errors"] == 0 and metrics["reward/timeouts"] == 0 and metrics["reward/sandbox_s"] > 0


def test_expected_values_compare_as_json_data(reward):
    meta = {"entry_point": "pair", "tests": [{"input": [1], "output": (1, {2: "b"})}]}
    code = "```python\ndef pair(x):\n    return (x, {2: 'b'})\n```"
    assert reward([code], answer=[""], metadata=[meta]) == [1.0]


def test_an_item_without_tests_scores_zero_and_is_counted(reward):
    assert reward(["```python\nx = 1\n```"], answer=[""], metadata=[{"question": "q"}]) == [0.0]
    assert reward.pop_metrics()["reward/errors"] == 1


def test_a_hanging_test_keeps_the_credit_of_the_tests_before_it(reward):
    it = item()
    (first,) = it["metadata"]["tests"][0]["input"]
    code = (
        f"```python\n{it['answer']}\n_orig = rotate_left\ndef rotate_left(items):\n"
        f"    if items != {first!r}:\n        while True:\n            pass\n    return _orig(items)\n```"
    )
    (score,) = reward([code], answer=[it["answer"]], metadata=[it["metadata"]])
    assert score == pytest.approx(1 / len(it["metadata"]["tests"]))
    reward.pop_metrics()


def test_gate_blocks_every_code_exploit_and_hostile_program(reward):
    results, unjudged = run_check(reward, CODE_PROBLEMS[:1])
    assert unjudged == [] and len(results) == len(CODE_EXPLOITS)
    assert [(r.exploit, r.score) for r in results if not r.passed] == []


def test_reward_config_takes_the_sandbox_limits():
    built = build_reward(["reward=code_tests", "sandbox.wall_s=3", "sandbox.workers=4"])
    assert isinstance(built, CodeTestsReward) and built.limits.wall_s == 3 and built.workers == 4


def test_bad_sandbox_config_fails_at_load_naming_the_key():
    from omegaconf import OmegaConf

    from rl.config.schema import ConfigError, SandboxConfig

    with pytest.raises(ConfigError, match="sandbox.cpu_s must be > 0"):
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SandboxConfig), {"cpu_s": 0}))


def test_env_items_are_deterministic_distinct_and_held_out():
    a, b = CodeTasksEnv(size=200, seed=3, eval_size=16), CodeTasksEnv(size=200, seed=3, eval_size=16)
    assert a.train_items() == b.train_items() and a.eval_items() == b.eval_items()
    other = CodeTasksEnv(size=200, seed=4, eval_size=16)
    assert other.train_items() != a.train_items() and other.eval_items() == a.eval_items()
    keys = [(it["metadata"]["task"], repr(it["metadata"]["params"])) for it in a.train_items()]
    held = {(it["metadata"]["task"], repr(it["metadata"]["params"])) for it in a.eval_items()}
    assert len(keys) == len(set(keys)) == 200 and not held & set(keys)
    assert {it["metadata"]["task"] for it in a.train_items()} == {f.name for f in FAMILIES}
    first = a.train_items()[0]
    assert "```python" in first["messages"][-1]["content"] and len(first["metadata"]["tests"]) == 8
    assert first["metadata"]["example"] not in first["metadata"]["tests"]


def test_env_rejects_unknown_families():
    with pytest.raises(ValueError, match="env.families has unknown names"):
        CodeTasksEnv(size=4, eval_size=1, families=["nope"])


def test_reference_solutions_pass_their_own_tests_in_the_sandbox(reward):
    """Three items of every family: each reference source, run through the sandbox, passes all of its tests."""
    env = CodeTasksEnv(size=3 * len(FAMILIES), seed=0, eval_size=0)
    sample = env.train_items()
    assert Counter(it["metadata"]["task"] for it in sample) == dict.fromkeys((f.name for f in FAMILIES), 3)
    scores = reward(
        [f"```python\n{it['answer']}```" for it in sample],
        answer=[it["answer"] for it in sample],
        metadata=[it["metadata"] for it in sample],
    )
    assert scores == [1.0] * len(sample)


def test_every_family_has_at_least_30_distinct_tasks():
    """A family is a template; its tasks are its distinct parameter sets (what the env deduplicates on)."""
    rng = random.Random(0)
    sizes = {f.name: len({repr(f.params(rng)) for _ in range(3000)}) for f in FAMILIES}
    assert min(sizes.values()) >= 30, sizes
