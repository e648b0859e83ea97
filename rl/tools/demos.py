"""Demonstrations drawn from an environment: `python -m rl.tools.demos [train overrides] --n N --out FILE`.

    python -m rl.tools.demos env=calc_products --n 256 --out demos/calc_products.jsonl   # a call, its result, the answer
    python -m rl.tools.demos env=retry --n 256 --out demos/retry.jsonl                   # wrong, the feedback, corrected
    python -m rl.tools.demos env=code_tasks reward=code_tests --n 64 --out demos/code.jsonl  # a passing solution

Why: a model learns to use tools or feedback by RL only once it sometimes does so on its own; SmolLM2 never calls
the calculator. A supervised warm start on correct episodes gives it the format first, and the environments know
how their tasks are solved, so they write those episodes themselves. The overrides are a run's (the same env,
reward, seed and model), so the episodes are the ones that run would see.

Each demonstration is played through the environment as a rollout is (`start`, then each model turn and the
environment's answer from `step`, until it ends the episode): its tool results and feedback are the env's own, and
the run's reward must score its last answer as correct (`eval.correct_threshold`), else it is not written. An env
writes its turns with `demonstrate(episode, rng)` (multi-turn) or `answer_text(item)` (single-turn); envs/retry.py
and envs/tool_task.py have the first, envs/reasoning_gym.py and envs/code_tasks.py the second.

One JSON object per line, written atomically: `prompt` (the item's messages), `tools` (hermes tool schemas, or
null), `turns` (the model's texts in order), `messages` (the conversation after the prompt: the model's turns and
the environment's messages; a model turn that only sets the scene, such as retry's wrong first answer, carries
`"train": false` and a warm start does not imitate it), `answer`, `reward`, `tool_calls`, `tool_errors`, `index`
(the item's position in the env's training items).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from envs.protocol import ContextTurn, Episode, is_multi_turn
from rl.atomic import replace_when_done

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def demonstrate(env: Any, item: dict[str, Any], rng: random.Random) -> Episode:
    """One demonstration of `item`, played through `env` (multi-turn envs) or its right answer (single-turn)."""
    if not is_multi_turn(env):
        if not callable(getattr(env, "answer_text", None)):
            raise ValueError(f"env {type(env).__name__} writes no demonstrations: it has no answer_text(item)")
        episode = Episode(item, [dict(m) for m in item["messages"]])
        episode.messages.append({"role": "assistant", "content": env.answer_text(item)})
        episode.turns = 1
        return episode
    if not callable(getattr(env, "demonstrate", None)):
        raise ValueError(f"env {type(env).__name__} writes no demonstrations: it has no demonstrate(episode, rng)")
    episode = env.start(item)
    while True:
        text = env.demonstrate(episode, rng)
        episode.turns += 1
        turn = {"role": "assistant", "content": str(text)}
        episode.messages.append(turn | ({"train": False} if isinstance(text, ContextTurn) else {}))
        reply = env.step(episode, str(text))
        if reply is None:
            return episode
        episode.messages.extend(reply)


def demonstrations(env: Any, reward_fn: Any, n: int, seed: int, threshold: float = 1.0) -> tuple[list[dict], int]:
    """Up to `n` demonstrations of distinct training items, drawn in a seeded order, each scored by the run's
    reward at `threshold` or above; (rows, how many were dropped because the reward did not count them correct)."""
    items = env.train_items()
    rng = random.Random(seed)
    order = rng.sample(range(len(items)), len(items))
    rows, dropped = list[dict](), 0
    for index in order:
        if len(rows) == n:
            break
        item = items[index]
        episode = demonstrate(env, item, rng)
        prompt_len = len(item["messages"])
        last = episode.messages[prompt_len:]
        final = next(m["content"] for m in reversed(last) if m["role"] == "assistant")
        score = float(reward_fn([final], answer=[item["answer"]], metadata=[item.get("metadata", {})])[0])
        if score < threshold:
            dropped += 1
            continue
        rows.append(
            {
                "prompt": item["messages"],
                "tools": item.get("tools"),
                "turns": [m["content"] for m in last if m["role"] == "assistant"],
                "messages": last,
                "answer": item["answer"],
                "reward": score,
                "tool_calls": episode.tool_calls,
                "tool_errors": episode.tool_errors,
                "index": index,
            }
        )
    return rows, dropped


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with replace_when_done(path) as tmp:
        tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))


def reward_name(node: Any) -> str:
    """The scoring class of a reward config (a RewardRunner's inner `reward`), for the message that names it."""
    inner = node.get("reward")
    return str(inner.get("_target_") if hasattr(inner, "get") and inner.get("_target_") else node.get("_target_"))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m rl.tools.demos", description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, required=True, help="demonstrations to write")
    ap.add_argument("--out", required=True, help="the JSONL file to write")
    ap.add_argument("overrides", nargs="*", help="a run's overrides (env=..., reward=..., run.seed=...)")
    args = ap.parse_intermixed_args(argv)  # overrides before, between or after --n and --out
    from rl.config.schema import TrainConfig, register_configs
    from rl.entry import build_target, check_renamed, compose_checked, fail

    if args.n < 1:
        fail(f"--n must be >= 1 (got {args.n})")
    out = Path(args.out)
    if out.is_dir():  # the write-then-rename would replace the folder, and everything in it, by the file
        fail(f"--out {out} is a folder: give the JSONL file to write, e.g. --out {out / 'demos.jsonl'}")
    check_renamed(args.overrides)
    register_configs()
    dcfg, cfg = compose_checked(CONF_DIR, "train", args.overrides, TrainConfig)
    env = build_target(dcfg.env, "env")
    reward = build_target(dcfg.reward, "reward")
    try:
        rows, dropped = demonstrations(env, reward, args.n, cfg.run.seed, cfg.eval.correct_threshold)
    except ValueError as e:
        fail(str(e))
    if not rows:  # an empty file would only fail the warm start later, as "holds no demonstration"
        fail(
            f"no demonstration written: the reward ({reward_name(dcfg.reward)}) scored all {dropped} of the env's "
            f"demonstrations below eval.correct_threshold={cfg.eval.correct_threshold}: give the reward this env trains "
            "with (reward=..., e.g. reward=code_tests for env=code_tasks)",
            code=1,
        )
    try:
        write_jsonl(out, rows)
    except OSError as e:
        fail(f"--out {out}: cannot write there ({e.strerror}): give a file in a folder this user can create and write")
    note = f"; {dropped} dropped: the reward did not count them correct" if dropped else ""
    print(f"{len(rows)} demonstrations of {dcfg.env._target_} -> {out}{note}", flush=True)
    if len(rows) < args.n:
        print(f"only {len(rows)} of --n {args.n}: the env has no more training items that its demonstrations solve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
