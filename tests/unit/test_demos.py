"""Demonstrations drawn from the environments (rl/tools/demos.py): each env's episodes, built from its conf/env
file as a run builds it, are correct by the run's own reward and replay through the env unchanged."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import pytest

from envs.protocol import is_multi_turn
from rl.tools.demos import demonstrate, demonstrations
from tests.helpers import REPO, env_and_reward


def _item(env, row: dict) -> dict:
    return env.train_items()[row["index"]]


def replays(env, row: dict) -> bool:
    """The row's prompt is its item's, and its model turns, played through a fresh episode of the env, draw the same
    environment messages."""
    item = _item(env, row)
    episode, messages = env.start(item), []
    for text in row["turns"]:
        episode.turns += 1
        episode.messages.append({"role": "assistant", "content": text})
        messages.append({"role": "assistant", "content": text})
        reply = env.step(episode, text)
        if reply is None:
            break
        episode.messages.extend(reply)
        messages.extend(reply)
    said = [{k: v for k, v in m.items() if k != "train"} for m in row["messages"]]  # the env sees the text only
    return item["messages"] == row["prompt"] and messages == said


@pytest.mark.parametrize("fmt", ["tag", "hermes"])
def test_tool_use_demonstrations_call_the_calculator_once_and_answer_its_result(fmt):
    env, reward = env_and_reward("env=calc_products", f"env.tool_format={fmt}")
    rows, dropped = demonstrations(env, reward, 8, seed=0)
    assert len(rows) == 8 and dropped == 0
    for row in rows:
        assert row["reward"] == 1.0 and row["tool_calls"] == 1 and row["tool_errors"] == 0
        call, result, answer = row["messages"]
        assert call["role"] == answer["role"] == "assistant" and row["answer"] in result["content"]
        assert answer["content"] == f"The answer is {row['answer']}." and replays(env, row)
        assert ("<tool>calculator:" if fmt == "tag" else "<tool_call>") in call["content"]
        assert (row["tools"] is None) == (fmt == "tag")  # hermes items carry the tool schemas for the template
    assert len({r["index"] for r in rows}) == 8  # distinct items


def test_retry_demonstrations_answer_wrong_read_the_feedback_and_correct_it():
    env, reward = env_and_reward("env=retry")
    rows, _ = demonstrations(env, reward, 8, seed=0)
    assert len(rows) == 8
    for row in rows:
        wrong, feedback, right = row["messages"]
        assert feedback == {"role": "user", "content": env.feedback} and row["reward"] == 1.0
        assert wrong["train"] is False and "train" not in right  # a warm start learns the correction, not the error
        item = _item(env, row)
        assert reward([wrong["content"]], answer=[item["answer"]], metadata=[item["metadata"]])[0] == 0.0
        assert right["content"] == f"The answer is {row['answer']}." and replays(env, row)


def test_code_task_demonstrations_are_reference_solutions_that_pass_their_tests():
    env, reward = env_and_reward("env=code_tasks", "reward=code_tests")
    rows, dropped = demonstrations(env, reward, 3, seed=0)
    assert len(rows) == 3 and dropped == 0 and all(r["reward"] == 1.0 for r in rows)
    assert all(r["turns"][0].startswith("```python\n") and r["turns"][0].endswith("```") for r in rows)


def test_a_demonstration_the_reward_rejects_is_dropped_and_an_env_without_demonstrations_fails():
    env, _ = env_and_reward("env=chain_sum")
    rows, dropped = demonstrations(env, lambda texts, **_: [0.0] * len(texts), 4, seed=0)
    assert rows == [] and dropped == len(env.train_items())

    class NoDemos:
        def train_items(self):
            return [{"messages": [{"role": "user", "content": "q"}], "answer": "1"}]

        def eval_items(self):
            return []

    with pytest.raises(ValueError, match="NoDemos writes no demonstrations"):
        demonstrate(NoDemos(), NoDemos().train_items()[0], random.Random(0))
    assert not is_multi_turn(NoDemos())


def test_the_command_writes_the_jsonl_and_names_a_bad_key(tmp_path):
    out = tmp_path / "d" / "calc.jsonl"
    cmd = [sys.executable, "-m", "rl.tools.demos", "env=calc_products", "--n", "3", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "3 demonstrations of envs.tool_task.ToolEnv" in proc.stdout
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["tool_calls"] == 1 for r in rows)
    bad = subprocess.run([*cmd[:3], "steps=3", *cmd[4:]], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: 'steps' is now 'run.steps': write run.steps=... (python -m rl.tools.keys lists every key)"
    )


def test_the_command_refuses_a_folder_as_out_and_writes_no_file_when_the_reward_rejects_every_demonstration(tmp_path):
    (tmp_path / "mine.jsonl").write_text("{}\n")
    cmd = [sys.executable, "-m", "rl.tools.demos", "env=chain_sum", "env.size=16", "--n", "2", "--out"]
    folder = subprocess.run([*cmd, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert folder.returncode == 2 and folder.stderr.strip() == (
        f"error: --out {tmp_path} is a folder: give the JSONL file to write, e.g. --out {tmp_path / 'demos.jsonl'}"
    )
    assert (tmp_path / "mine.jsonl").read_text() == "{}\n"  # the folder and what it held are left alone
    out = tmp_path / "boxed.jsonl"
    rejected = subprocess.run(
        [*cmd, str(out), "reward=boxed", "reward.workers=0"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert rejected.returncode == 1 and not out.exists()
    assert re.match(
        r"error: no demonstration written: the reward \(rewards\.math\.BoxedReward\) scored all \d+ of the env's",
        rejected.stderr,
    ), rejected.stderr
    assert "\n" not in rejected.stderr.strip()
