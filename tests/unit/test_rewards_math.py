"""Math rewards: extraction, equivalences math-verify handles, hardening, and the gold answers of GSM8K/MATH-500."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envs.boxed import boxed_contents, last_boxed
from rewards.combine import WeightedSum
from rewards.format import FormatReward
from rewards.math import BoxedReward, ThinkAnswerReward, answers_match, normalize_answer

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} (shared benchmark copies) is absent")


def test_last_boxed_balanced_braces_and_nesting():
    text = r"first \boxed{1} then \boxed{\frac{1}{2}} and \fbox{x^{2}}"
    assert boxed_contents(text) == ["1", r"\frac{1}{2}", "x^{2}"]
    assert last_boxed(r"\boxed{\left\{ 1, 2 \right\}}") == r"\left\{ 1, 2 \right\}"
    assert last_boxed(r"\boxed{\boxed{7}}") == r"\boxed{7}"
    assert last_boxed(r"no box") is None
    assert last_boxed(r"\boxed{unclosed") is None


@pytest.mark.parametrize(
    "pred,gold",
    [
        (r"0.5", r"\frac{1}{2}"),
        (r"(3,\pi/2)", r"\left( 3, \frac{\pi}{2} \right)"),
        (r"10\%", "10"),
        ("10", r"10\%"),
        (r"\dfrac{1}{2}", r"\frac12"),
        ("1,600", "1600"),
        (r"\$18", "18"),
        (r"18 \text{ dollars}", "18"),
        ("x = 18", "18"),
        (r"\text{(C)}", r"\text{(C)}"),
        ("p-q", "p - q"),
    ],
)
def test_equivalences_pass(pred, gold):
    assert answers_match(pred, gold)
    assert BoxedReward()([f"so \\boxed{{{pred}}}."], answer=[gold]) == [1.0]


@pytest.mark.parametrize(
    "pred,gold",
    [
        ("19", "18"),
        (r"\frac{1}{3}", r"\frac{1}{2}"),
        ("19 = 18", "18"),
        ("p + q = p - q", "p - q"),
        ("1, 2, 18", "18"),
        (r"17 \text{ or } 18", "18"),
        ("x", "18"),
        ("1О", "10"),
        ("\u202e81", "18"),
    ],
)
def test_wrong_answers_fail(pred, gold):
    assert not answers_match(pred, gold)


def test_boxed_reward_rejects_conflicting_boxes_unless_last_mode():
    text = r"maybe \boxed{17}, no: \boxed{18}"
    assert BoxedReward()([text], answer=["18"]) == [0.0]
    assert BoxedReward(multiple_boxed="last")([text], answer=["18"]) == [1.0]
    assert BoxedReward()([r"\boxed{18} so \boxed{18.0}"], answer=["18"]) == [1.0]  # agreeing boxes are fine
    assert BoxedReward()(["the answer is 18"], answer=["18"]) == [0.0]  # no last-number fallback


def test_boxed_reward_scores_odd_input_zero_and_counts_it():
    reward = BoxedReward()
    assert reward([None, r"\boxed{1}", r"\boxed{1}"], answer=["1", None, "1"]) == [0.0, 0.0, 1.0]
    assert reward.errors == 2
    long_answer = "1+" * 1000 + "1"
    assert reward([f"\\boxed{{{long_answer}}}"], answer=["1001"]) == [0.0]  # over max_answer_chars


def test_think_answer_reward():
    reward = ThinkAnswerReward()
    assert reward(["<think>7+11</think>\n<answer>18</answer>"], answer=["18"]) == [1.0]
    assert reward(["<think>x</think><answer>\\boxed{18}</answer>"], answer=["18"]) == [1.0]
    assert reward(["<think>\\boxed{18}</think><answer></answer>"], answer=["18"]) == [0.0]
    assert reward(["<answer>17</answer><answer>18</answer>"], answer=["18"]) == [0.0]
    assert ThinkAnswerReward(think_in_prompt=True)(["reasoning</think><answer>18</answer>"], answer=["18"]) == [1.0]


def test_seed_10_5_0_scheme_and_format_gate():
    reward = BoxedReward(correct_score=10, format_score=5, wrong_score=0, format_gate=True, format_mode="strict")
    texts = [r"work... \boxed{18}", r"work... \boxed{17}", "18", r"\boxed{18} and more words after"]
    assert reward(texts, answer=["18"] * 4) == [10.0, 5.0, 0.0, 0.0]


def test_format_rewards_strict_and_soft():
    strict, soft = FormatReward("think_answer", "strict"), FormatReward("think_answer", "soft")
    good = "<think>\nsteps\n</think>\n<answer>\n18\n</answer>"
    sloppy = "Sure! <think>steps</think> then <answer>18</answer> done"
    assert strict([good, sloppy], answer=["18"] * 2) == [1.0, 0.0]
    assert soft([good, sloppy], answer=["18"] * 2) == [1.0, 1.0]
    assert soft(["<think></think><answer> </answer>"]) == [0.0]
    boxed_strict = FormatReward("boxed", "strict")
    assert boxed_strict([r"so \boxed{3}.", r"\boxed{3} then text", r"\boxed{1}\boxed{2}"]) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="style"):
        FormatReward("xml")


def test_weighted_sum_combines_and_loads_dotted_paths():
    reward = WeightedSum(
        [{"reward": BoxedReward(), "weight": 0.9}, {"reward": FormatReward("boxed", "strict"), "weight": 0.1}]
    )
    assert reward([r"\boxed{18}", r"\boxed{17}", "18"], answer=["18"] * 3) == pytest.approx([1.0, 0.1, 0.0])
    by_path = WeightedSum([{"reward": "rewards.math.BoxedReward", "weight": 2.0}])
    assert by_path([r"\boxed{18}"], answer=["18"]) == [2.0]


def _gsm8k_gold(row: dict) -> str:
    return row["answer"].rsplit("####", 1)[1].strip()


def _wrong(i: int, golds: list[str]) -> str:
    """gold + 1 for integers, else the nearest earlier gold with a different value (`x=5` and `5` are the same)."""
    plain = golds[i].replace(",", "")
    if re.fullmatch(r"-?\d+", plain):
        return str(int(plain) + 1)
    value = normalize_answer(golds[i].split("=")[-1])
    return next(g for g in golds[i - 1 :: -1] + golds[::-1] if normalize_answer(g.split("=")[-1]) != value)


def _gold_rates(path: Path, gold_of, n: int | None) -> tuple[float, float]:
    rows = [json.loads(line) for line in path.open()][:n]
    golds = [gold_of(r) for r in rows]
    reward = BoxedReward()
    right = reward([f"Step by step... The answer is $\\boxed{{{g}}}$." for g in golds], answer=golds)
    wrong = reward([f"\\boxed{{{_wrong(i, golds)}}}" for i in range(len(golds))], answer=golds)
    return sum(right) / len(golds), sum(wrong) / len(golds)


@needs_data
def test_gsm8k_and_math500_gold_answers_score_one_and_changed_answers_zero_subset():
    for path, gold_of in [
        (DATA / "gsm8k/test.jsonl", _gsm8k_gold),
        (DATA / "math500/test.jsonl", lambda r: r["answer"]),
    ]:
        right, wrong = _gold_rates(path, gold_of, 120)
        assert right >= 0.99 and wrong == 0.0, (path, right, wrong)


@needs_data
@pytest.mark.slow
def test_gsm8k_and_math500_gold_answers_all_rows():
    for path, gold_of in [
        (DATA / "gsm8k/test.jsonl", _gsm8k_gold),
        (DATA / "math500/test.jsonl", lambda r: r["answer"]),
    ]:
        right, wrong = _gold_rates(path, gold_of, None)
        assert right >= 0.99 and wrong == 0.0, (path, right, wrong)


@needs_data
def test_math500_golds_match_through_math_verify_without_the_string_fallback():
    """The exact-match fallback would make gold-vs-gold trivial: check math-verify itself reads every gold."""
    from math_verify import verify

    from rewards.math import parse_math

    golds = [json.loads(line)["answer"] for line in (DATA / "math500/test.jsonl").open()][:150]
    ok = sum(bool(parse_math(g, 5)) and verify(list(parse_math(g, 5)), list(parse_math(g, 5))) for g in golds)
    assert ok / len(golds) >= 0.99


def test_boxes_longer_than_max_answer_chars_disagree_without_being_parsed():
    """Two differing boxes of 300 000 characters: parsing them would take math-verify its whole timeout (raising
    RewardTimeout in this thread); over max_answer_chars they disagree unparsed and score 0."""
    from rewards.math import BoxedReward

    huge = "\\boxed{" + "1+" * 150_000 + "1} \\boxed{2}"
    assert BoxedReward(max_answer_chars=300).score_one(huge, "2") == 0.0
    assert BoxedReward(multiple_boxed="last").score_one(huge, "2") == 1.0
