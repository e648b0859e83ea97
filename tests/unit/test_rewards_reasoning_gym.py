"""The default reward (reward=reasoning_gym): correct answers in the forms a model writes get credit, every
exploit of the hacking gate and its plain-text variants get none."""

from __future__ import annotations

import pytest

from rewards.reasoning_gym import ReasoningGymScore, extract_answer
from rewards.runner import RewardRunner
from rl.tools.reward_check import build_reward, run_check

# a chain_sum item as envs/reasoning_gym.py builds it (metadata: the task's own, plus task and question)
META = {
    "task": "chain_sum",
    "question": "State the final answer to the following arithmetic problem: 0 - 4 =",
    "expression": "0 - 4",
}


def score(completions: list[str], gold: str = "-4", meta: dict = META) -> list[float]:
    return ReasoningGymScore()(completions, answer=[gold] * len(completions), metadata=[meta] * len(completions))


def test_the_default_reward_passes_its_hacking_gate():
    reward = build_reward(["reward=reasoning_gym", "reward.workers=0"])
    assert reward.reward.extract == "final_number"
    results, unjudged = run_check(reward)
    assert len(unjudged) < 5 and results  # the chain_sum problems are judged (the others have no task)
    assert [r for r in results if not r.passed] == []


def test_the_unhardened_last_number_mode_fails_the_gate():
    """Why final_number exists: the plain last number pays for lists, hedges and unclosed boxes."""
    results, _ = run_check(ReasoningGymScore(extract="last_number"))
    assert {r.exploit for r in results if not r.passed} >= {"many_boxed_gold_last", "boxed_or", "unclosed_box"}


@pytest.mark.parametrize(
    "completion",
    [
        "-4",
        "0 - 4 = -4",
        "0-4=-4",
        "The final answer to the arithmetic problem is -4.",
        "-4 is the final answer to the given arithmetic problem.",
        "1. 0 - 4 = -4.",
        "State the final answer to the following arithmetic problem: 0 - 4 = -4",
        "The answer is \\boxed{-4}.",
        "\\boxed{-4} so the answer is \\boxed{-4}",
        "$\\boxed{-4}$",
        "<think>\n0 minus 4\n</think>\n<answer>\n-4\n</answer>",
        "<think>\nok\n</think>\n<answer>\\boxed{-4}</answer>",
    ],
)
def test_a_stated_right_answer_gets_full_credit(completion):
    assert score([completion]) == [1.0]


def test_wrong_answers_score_zero():
    assert score(["0 - 4 = 4", "The answer is 3.", "\\boxed{-3}", "<answer>4</answer>"]) == [0.0] * 4


def test_thousands_and_answers_equal_to_an_operand():
    assert score(["The total is 1,000."], gold="1000") == [1.0]
    meta = {"task": "chain_sum", "question": "State ... problem: 6 - 0 =", "expression": "6 - 0"}
    assert score(["6 - 0 = 6", "The answer is 6."], gold="6", meta=meta) == [1.0, 1.0]


@pytest.mark.parametrize(
    "completion",
    [
        "0 - 4",  # echoes the expression: its last number is not an answer
        "0-4",  # a minus right after a digit is an operator, not the sign of -4
        "State the final answer to the following arithmetic problem: 0 - 4 =",  # the question, copied
        "-3 or -4",
        "-5, -4",
        "-5; -4",
        " ".join(str(i) for i in range(50)) + " -4",  # a spray of numbers ending in the answer
        "The answer is \\boxed{-4",  # unclosed box: no falling back to the text's last number
        "\\boxed{\\boxed{-4}}",
        "\\boxed{-3} \\boxed{-4}",
        "\\boxed{-3, -4}",
        "\\boxed{-3 = -4}",
        "\\boxed{-3 \\text{ or } -4}",
        "<answer>-3</answer><answer>-4</answer>",
        "<answer>-4",
        "<answer><answer>-4</answer></answer>",
        "\\boxed{-3} <answer>-4</answer>",  # two declared answers that disagree
    ],
)
def test_exploits_score_zero(completion):
    assert score([completion]) == [0.0]


def test_other_scripts_digits_never_become_an_answer():
    meta = {"task": "chain_sum", "question": "State ... problem: 1 + 1 =", "expression": "1 + 1"}
    assert score(["1 + 1 = \u0662", "1 + 1 = \uff12"], gold="2", meta=meta) == [0.0, 0.0]  # Arabic-Indic, fullwidth


def test_a_question_that_contains_its_answer_pays_only_for_a_stated_answer():
    meta = {"task": "chain_sum", "question": "Is the sum of 3 and 5 equal to 8? Give the sum."}
    copied = "Is the sum of 3 and 5 equal to 8?  Give  the sum."  # re-spaced copy
    assert score([copied, "The sum is 8."], gold="8", meta=meta) == [0.0, 1.0]


def test_the_env_gives_the_reward_the_question_and_expression():
    from envs.reasoning_gym import ReasoningGymEnv

    env = ReasoningGymEnv(size=8, eval_size=2, config={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    item = env.train_items()[0]
    assert item["metadata"]["question"] == item["question"]
    assert item["metadata"]["expression"] in item["question"]
    reward = ReasoningGymScore()
    echo = reward([item["question"]], answer=[item["answer"]], metadata=[item["metadata"]])
    stated = reward([f"The answer is {item['answer']}."], answer=[item["answer"]], metadata=[item["metadata"]])
    assert (echo, stated) == ([0.0], [1.0])


def test_an_unknown_mode_fails_at_construction():
    with pytest.raises(ValueError, match="final_number"):
        ReasoningGymScore(extract="first_number")
    assert extract_answer("x = 3", "last_number") == "3"


def test_the_default_reward_scores_in_workers_with_a_per_sample_timeout():
    """Like every reward of free text, the default one cannot stall the driver: a runner bounds each sample."""
    reward = build_reward(["reward=reasoning_gym"])
    assert isinstance(reward, RewardRunner) and reward.workers >= 1 and 0 < reward.timeout_s <= 10
    try:
        right, wrong = ["The answer is -4.", "The answer is 4."], ["-4", "-4"]
        assert reward(right, answer=wrong, metadata=[META, META]) == [1.0, 0.0]
        assert reward.pop_metrics() == {"reward/errors": 0.0, "reward/timeouts": 0.0}
    finally:
        reward.close()


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>" * 200_000,  # a lazy tag regex scans to the end from each of them: about 10^11 steps
        "<answer>1</answer>" + "<answer>" * 200_000,
        "1" + " " * 1_000_000 + "x2",  # blanks fullmatched from both sides of the gap between two numbers
        "\\boxed{1" + " " * 1_000_000 + "x}",
        "1, " * 300_000 + "x 2",
    ],
    ids=["open-tags", "closed-then-open", "gap-blanks", "boxed-blanks", "long-list"],
)
def test_extraction_is_linear_on_a_megabyte_of_adversarial_text(completion):
    """Sizes at which a quadratic scan would not finish within any test run."""
    assert score([completion]) == [0.0]
    assert extract_answer(completion, "answer_tag", META) in (None, "1")
