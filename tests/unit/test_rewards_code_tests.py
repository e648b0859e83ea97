"""reward=code_tests (rewards/code_tests.py), its hacking-gate suite (rl/tools/reward_check_code.py) and env=code_tasks
(envs/code_tasks.py): real programs run in the real sandbox."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from envs.code_tasks import FAMILIES, CodeTasksEnv, make_item
from rewards.code_tests import MARK, CodeTestsReward, extract_code, parse_results, same_value, score_output
from rl.tools.reward_check import build_reward, run_check
from rl.tools.reward_check_code import CODE_EXPLOITS, CODE_PROBLEMS

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

    from rl.config.schema import TrainConfig

    with pytest.raises(ValueError, match="sandbox.cpu_s must be > 0"):  # the `sandbox` group is SandboxLimits
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), {"sandbox": {"cpu_s": 0}}))


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


# ------------------------------------------------------------------ the trainer side of the reward (attack class 7)

_OLD_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def _regex_extract(text: str) -> str:
    """The regex extract_code replaced: the scanner must agree with it wherever it finishes."""
    blocks = _OLD_FENCE.findall(text)
    return blocks[-1] if blocks else text


def test_extract_code_agrees_with_the_regex_it_replaced_on_random_text():
    rng = random.Random(0)
    alphabet = ["`", "``", "```", " ", "\t", "\n", "\r", "py", "python", "Python3", "x = 1", "PY", "3", "pyt"]
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 24)))
        assert extract_code(text) == _regex_extract(text), repr(text)


@pytest.mark.parametrize(
    "completion",
    [
        "```" + " " * 1_000_000,  # the regex backtracks between the two blank runs: about 10^11 steps
        "```py" + " \t" * 500_000,
        "```" * 400_000,
        "```python\n" * 100_000,
        "``" + "` " * 500_000,
        "```python\nx = 1\n" + "````" * 250_000,
    ],
    ids=["blanks", "tag-blanks", "fences", "openers", "half-fences", "closers"],
)
def test_extract_code_is_linear_on_a_megabyte_of_adversarial_text(completion):
    """Sizes at which a quadratic scan would not finish within any test run; the results are the regex's on a
    cut-down copy of the same shape."""
    out = extract_code(completion)
    assert isinstance(out, str) and len(out) <= len(completion)
    small = completion[:3000]
    assert extract_code(small) == _regex_extract(small)


def _json_bomb(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "stdout",
    [
        f"{MARK}[0, {_json_bomb(100_000)}]",  # nesting past the JSON parser's recursion limit
        f"{MARK}[0, {'9' * 50_000}]",  # an integer past Python's digit limit
        f"{MARK}[0, 1{'0' * 400}]\n{MARK}[1, NaN]\n{MARK}[2, Infinity]\n{MARK}[3, -Infinity]",
        f'{MARK}[0, "\ufffd\ufffd"]\n{MARK}[1, "a\\u0000b"]\n\x00\x00{MARK}[2, 5]',
        f"{MARK}" + "x" * 3_000_000,
        "\n".join(f'{MARK}[{i}, {{"a": [1, 2, {{"b": null}}]}}]' for i in range(50_000)),
        f'{MARK}[true, 5]\n{MARK}[-1, 5]\n{MARK}[1e300, 5]\n{MARK}{{"0": 5}}\n{MARK}[0]\n{MARK}null',
    ],
    ids=["deep", "digits", "huge-nan-inf", "utf8-nul", "megabytes", "many", "shapes"],
)
def test_any_output_scores_without_raising(stdout):
    want = [1.5, 7, "seven", [7]]
    score, why = score_output(stdout, want)
    assert score == 0.0 and isinstance(why, str)


def test_same_value_never_raises_on_extreme_numbers():
    assert not same_value(10**400, 1.5) and not same_value(1.5, 10**400) and same_value(10**400, 10**400)
    assert not same_value(float("nan"), 1.0) and not same_value(float("inf"), 1.0)


def test_fuzzed_outputs_never_raise_and_never_score_without_the_answers():
    """Random and adversarial program outputs (structure, numbers, bytes) through the reward's parser: a score in
    [0, 1] every time, and 0 unless the output carries a right answer (none of these can: the answers are
    strings the fuzzer never writes)."""
    rng = random.Random(1)
    want = ["answer-a", "answer-b", ["answer-c"]]
    atoms = ['"x"', "1", "-0", "1e999", "NaN", "true", "null", "[", "]", "{", "}", ",", ":", '"\\ud800"', "9" * 5000]
    for _ in range(2000):
        parts = []
        for _ in range(rng.randrange(1, 6)):
            body = "".join(rng.choice(atoms) for _ in range(rng.randrange(0, 12)))
            idx = rng.choice(["0", "1", "2", "-1", "true", "1.0", "99999999999999999999"])
            parts.append(rng.choice([f"{MARK}[{idx}, {body}]", f"{MARK}{body}", body, "\x00\udcff" + body]))
        score, _ = score_output("\n".join(parts), want)
        assert score == 0.0


def test_fuzzed_completions_through_the_whole_reward_never_raise(reward):
    """Completions with fences, blanks and hostile output routines, scored for real: every call returns one
    score per completion, 0 for each (none solves rotate_left), and a reason for each."""
    it = item()
    rng = random.Random(2)
    printers = [
        "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x00' * 1000)\n",
        f"print({MARK!r} + '[0, ' + '[' * 50000 + ']' * 50000 + ']')\n",
        f"print({MARK!r} + '[0, ' + '9' * 10000 + ']')\n",
        f"print({MARK!r} + '[0, NaN]')\n",
        "print('x' * 10**6)\n",
        "",
    ]
    completions = []
    for _ in range(6):
        body = rng.choice(printers) + "def rotate_left(items):\n    return None\n"
        fence = rng.choice(["```python\n", "```py \n", "```\n", "``` \t\n", ""])
        completions.append(rng.choice(["", "text\n", "```bash\nls\n```\n"]) + fence + body + rng.choice(["```", ""]))
    scores = reward(completions, answer=[it["answer"]] * 6, metadata=[it["metadata"]] * 6)
    assert scores == [0.0] * 6 and len(reward.reasons) == 6 and all(reward.reasons)
    reward.pop_metrics()


def test_malformed_items_score_zero_and_are_counted(reward):
    bad = [None, {"entry_point": 3, "tests": [{"input": [1], "output": 1}]}, {"entry_point": "f", "tests": "no"},
           {"entry_point": "f", "tests": [{"input": 1, "output": 1}]}, {"entry_point": "f", "tests": [{"output": 1}]},
           {"entry_point": "f", "tests": [{"input": [{1, 2}], "output": 1}]}, {"entry_point": "f", "tests": [{"input": [1], "output": object()}]}]  # fmt: skip
    assert reward(["x = 1"] * len(bad), answer=[""] * len(bad), metadata=bad) == [0.0] * len(bad)
    assert reward.pop_metrics()["reward/errors"] == len(bad)


def test_reference_solutions_score_one_under_the_default_limits():
    """The default `sandbox` node (every limit at its default, including threads, open files and disk)."""
    env = CodeTasksEnv(size=len(FAMILIES), seed=1, eval_size=0)
    items = env.train_items()
    assert {it["metadata"]["task"] for it in items} == {f.name for f in FAMILIES}
    scores = CodeTestsReward()(
        [f"```python\n{it['answer']}```" for it in items],
        answer=[it["answer"] for it in items],
        metadata=[it["metadata"] for it in items],
    )
    assert scores == [1.0] * len(items)
