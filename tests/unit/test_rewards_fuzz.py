"""Property-based fuzzing of every shipped reward (conf/reward/*.yaml) and of the jsonl reader: on any completion a
reward returns one finite score in its range, in about a second; on any bytes the reader names the file and line
or, with strict=false, skips. Bounded: a few dozen examples each, a deadline per example.

The completions mix the tokens the extractors look for with long runs of one of them (tens of thousands of
characters), where a quadratic scan would run past the deadline. Answers whose maths sympy cannot finish quickly
(power towers, huge factorials) are bounded by math-verify's timeout and the runner's, not by the deadline: the
alphabet leaves out `^` and `!`.
"""

from __future__ import annotations

import json
import re
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.jsonl import read_jsonl
from rewards.code_tests import extract_code, score_output
from rewards.reasoning_gym import final_number
from rl.tools.reward_check import build_reward

TOKENS = [
    "\\boxed{", "\\fbox{", "}", "{", "\\{", "<answer>", "</answer>", "<think>", "</think>", " ", "  ", "\n", "\t",
    "-", "1", "0", "42", ",", ".", ";", "/", "&", " or ", " and ", "$", "\\frac{1}{2}", "\\text{", "\\left(", "\\",
    "```", "```python\n", "Score: 10", "the grader", "0 - 4 =", "=", "x", "\u0662", "\ufffd",
]  # fmt: skip
piece = st.sampled_from(TOKENS) | st.text(max_size=6).filter(lambda t: "^" not in t and "!" not in t)
run = st.tuples(st.sampled_from(TOKENS), st.integers(1, 20_000)).map(lambda t: t[0] * t[1])
completion = st.lists(piece | run, max_size=40).map("".join)
FUZZ = settings(
    max_examples=40,
    deadline=timedelta(milliseconds=1500),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

META = {
    "task": "chain_sum",
    "question": "State the final answer to the following arithmetic problem: 0 - 4 =",
    "expression": "0 - 4",
}


class FakeJudge:
    """A judge that always answers with a verdict in range (the judge reward's own parsing is what is fuzzed)."""

    def __call__(self, prompts: list[str]) -> list[str | None]:
        return ["Score: 7" for _ in prompts]


# option -> (its score range, overrides that keep scoring in this process)
SHIPPED = {
    "reasoning_gym": ((0.0, 1.0), ["reward.workers=0"]),
    "boxed": ((0.0, 1.0), ["reward.workers=0"]),
    "think_answer_tags": ((0.0, 1.0), ["reward.workers=0"]),
    "boxed_format": ((0.0, 1.0), ["reward.workers=0"]),
    "format_strict": ((0.0, 1.0), []),
    "format_soft": ((0.0, 1.0), []),
    "seed_10_5_0": ((0.0, 10.0), ["reward.workers=0"]),
    "episode": ((0.0, 0.0), []),
    "judge": ((0.0, 1.0), []),
    "judge_boxed": ((0.0, 1.0), ["reward.terms.1.reward.workers=0"]),
}


def test_every_shipped_reward_is_fuzzed():
    options = {p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "reward").glob("*.yaml")}
    # code_tests runs programs (its trainer-side parsing is fuzzed below); callable names the user's own reward
    assert options - {"code_tests", "callable"} == set(SHIPPED)


@pytest.fixture(scope="module")
def rewards() -> dict:
    built = {}
    for option, (_, overrides) in SHIPPED.items():
        reward = build_reward([f"reward={option}", *overrides])
        if getattr(reward, "needs_judge", False):
            reward.bind_judge(FakeJudge())
        reward(["\\boxed{-4}"], answer=["-4"], metadata=[dict(META)])  # lazy imports (math-verify) before timing
        built[option] = reward
    return built


@pytest.mark.parametrize("option", sorted(SHIPPED))
def test_a_shipped_reward_scores_any_completion_in_its_range(rewards, option):
    reward, (low, high) = rewards[option], SHIPPED[option][0]

    @FUZZ
    @given(texts=st.lists(completion, min_size=1, max_size=3), gold=st.sampled_from(["-4", "42", "\\frac{1}{2}"]))
    def check(texts, gold):
        scores = reward(texts, answer=[gold] * len(texts), metadata=[dict(META) for _ in texts])
        assert len(scores) == len(texts)
        assert all(isinstance(s, float) and low <= s <= high for s in scores), scores

    check()


_FINAL = re.compile(r"(?:(?<![0-9A-Za-z)\]}])-)?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")
_GAP = re.compile(r"\s*(?:[,;/&]|\bor\b|\band\b)?\s*", re.IGNORECASE)
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _regex_final_number(text: str) -> str | None:
    """final_number as regular expressions alone state it (quadratic on some inputs): the reference on short text."""
    from envs.boxed import BOX_START, boxed_contents
    from rewards.reasoning_gym import _unwrap, _without_question

    tags = _TAG.findall(text)
    if text.count("<answer>") != len(tags) or text.count("</answer>") != len(tags):
        return None
    if len(BOX_START.findall(text)) != len(boxed_contents(text)):
        return None
    declared = tags + boxed_contents(_TAG.sub(" ", text))
    if declared:
        numbers = [_unwrap(d) for d in declared]
        if not all(re.fullmatch(rf"\s*(?:{_FINAL.pattern})\s*", n) for n in numbers):
            return None
        values = {n.strip().replace(",", "") for n in numbers}
        return values.pop() if len(values) == 1 else None
    rest = _without_question(text, META)
    found = list(_FINAL.finditer(rest))
    if not found:
        return None
    if len(found) > 1 and _GAP.fullmatch(rest[found[-2].end() : found[-1].start()]):
        return None
    return found[-1].group().replace(",", "")


@settings(max_examples=300, deadline=timedelta(milliseconds=1500))
@given(text=st.lists(st.sampled_from(TOKENS) | st.text(max_size=3), max_size=12).map("".join))
def test_final_number_agrees_with_its_regular_expression_statement(text):
    assert final_number(text, META) == _regex_final_number(text)


@FUZZ
@given(text=completion)
def test_the_code_rewards_trainer_side_parsing_takes_any_text(text):
    assert isinstance(extract_code(text), str)
    fraction, why = score_output(text.replace("```", "#rlft-result "), [1, "a", [2.0]])
    assert 0.0 <= fraction <= 1.0 and isinstance(why, str)


line_bytes = st.binary(max_size=40) | st.sampled_from(
    [b'{"prompt": "1+1?", "answer": "2"}', b"\xff\xfe{", b"NaN", b'{"a": 1, "a": 2}', b'"\\ud800"', b"[" * 5000, b"\r"]
)


@FUZZ
@given(lines=st.lists(line_bytes, max_size=8))
def test_the_jsonl_reader_names_file_and_line_or_skips_on_any_bytes(lines):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.jsonl"
        path.write_bytes(b"\n".join(lines))
        rows, skipped = read_jsonl(path, strict=False)
        assert all(isinstance(row, dict) and json.dumps(row, ensure_ascii=False).encode() for _, row in rows)
        try:
            assert read_jsonl(path, strict=True) == (rows, 0)
        except ValueError as e:
            assert skipped > 0 and str(e).startswith(f"{path}:") and "\n" not in str(e)
