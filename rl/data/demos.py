"""Demonstrations as training samples, for the supervised warm start (algorithm=sft, algorithm.demos=FILE).

A demonstration is a prompt (chat messages, and tool schemas for a hermes tool template) and the conversation
after it: the model's turns and, between them, what the environment answered (tool results, feedback). It becomes
one sample exactly as an RL episode does (rl/rollout/episodes.py): the prompt through the chat template
(rl/data/prompts.py), each model turn as its text's tokens plus the end-of-turn token the model would have sampled
(loss mask 1), and the environment's messages through the same `EnvTokens` rendering (mask 0). So a warm start
trains the very tokens, in the very layout, that the RL run after it samples and scores.

The file: one JSON object per line with `prompt` (a list of messages), `messages` (the conversation after it, at
least one `assistant` message; one marked `"train": false` is context, not imitated) and optionally `tools`;
`python -m rl.tools.demos` writes such files, and a user's own follow the same form. Demonstrations whose prompt is
longer than model.max_prompt_tokens, or whose conversation is longer than the run's completion budget
(model.max_new_tokens, or env.max_episode_tokens for multi-turn envs), are dropped and counted. The order repeats in
seeded passes, whose position a checkpoint saves (PromptData's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envs.jsonl import jsonl_rows
from rl.config.errors import ConfigError
from rl.config.schema import ModelConfig
from rl.data.prompts import EnvTokens, PromptData
from rl.types import TrainSample


def chat_messages(value: Any) -> bool:
    """A list of {role, content} objects with string values (a tool result's role is `tool`, so any role)."""
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    )


def read_demos(path: str | Path) -> list[dict[str, Any]]:
    """The file's rows; a malformed line (not UTF-8, not plain JSON data, not a demonstration) is a ConfigError naming
    the file, the line and what is wrong. Read by envs/jsonl.py's rules, as the environments' jsonl files are."""
    if not Path(path).is_file():
        raise ConfigError(f"algorithm.demos={path}: no such file")
    rows = []
    for n, row, why in jsonl_rows(Path(path)):
        where = f"algorithm.demos={path}, line {n}"
        if why is not None:
            raise ConfigError(f"{where}: {why}")
        if not isinstance(row, dict):
            raise ConfigError(
                f"{where}: a line must be a JSON object with prompt and messages, got {type(row).__name__}"
            )
        prompt, messages = row.get("prompt"), row.get("messages")
        if not (chat_messages(prompt) and prompt):
            raise ConfigError(f'{where}: "prompt" must be a non-empty list of chat messages')
        if not chat_messages(messages):
            raise ConfigError(
                f'{where}: "messages" must be a list of chat messages, each with a string role and content'
            )
        if not any(m["role"] == "assistant" for m in messages):
            raise ConfigError(
                f'{where}: "messages" must hold the conversation after the prompt, model turns as "assistant"'
            )
        rows.append(row)
    if not rows:
        raise ConfigError(f"algorithm.demos={path} holds no demonstration")
    return rows


def render_conversation(
    tokenizer: Any, messages: list[dict], use_chat_template: bool, tools: list[dict] | None = None
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of the conversation after the prompt, as an episode lays it out: each model turn's
    tokens and its end-of-turn token with mask 1 (0 for a turn marked `"train": false`), the environment's messages
    between turns with mask 0."""
    env_tokens = EnvTokens(tokenizer, use_chat_template)
    ids: list[int] = []
    mask: list[int] = []
    pending: list[dict] = []
    for m in messages:
        if m["role"] != "assistant":
            pending.append(m)
            continue
        if pending:
            t = env_tokens.encode(pending, ids[-1] if ids else None, tools)
            ids, mask, pending = ids + t, mask + [0] * len(t), []
        t = list(tokenizer(m["content"], add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
        ids, mask = ids + t, mask + [int(m.get("train", True))] * len(t)  # "train": false: context, not imitated
    return ids, mask


class Demonstrations:
    """The demonstrations of `path` as training samples, served `run.prompts_per_step` a step. `m`: the resolved
    `model` group; `budget`: the run's completion budget (the schema's completion_tokens); `seed`: run.seed."""

    def __init__(self, path: str | Path, tokenizer: Any, m: ModelConfig, *, budget: int, seed: int):
        items, too_long = [], 0
        for row in read_demos(path):
            ids, mask = render_conversation(tokenizer, row["messages"], m.use_chat_template, row.get("tools"))
            if len(ids) > budget:
                too_long += 1
                continue
            items.append({"messages": row["prompt"], "tools": row.get("tools"), "completion": (ids, mask)})
        # PromptData tokenises the prompts, drops (and counts) those over model.max_prompt_tokens, and keeps the order
        self.data = PromptData(items, tokenizer, m, seed=seed)
        self.dropped = too_long + self.data.dropped
        self.samples = [
            TrainSample(prompt, ids, [0.0] * len(ids), 1.0, mask)
            for prompt, (ids, mask) in zip(self.data.prompt_ids, (it["completion"] for it in self.data.items))
        ]
        if not self.samples:
            raise ConfigError(
                f"algorithm.demos={path}: all {self.dropped} demonstrations are longer than model.max_prompt_tokens="
                f"{m.max_prompt_tokens} (prompt) or the completion budget of {budget} tokens: raise those"
            )

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def cursor(self) -> int:
        return self.data.cursor

    def next(self, n: int) -> tuple[list[TrainSample], dict[str, float]]:
        """The next `n` demonstrations and their metrics."""
        batch = [self.samples[i] for i in self.data.next_batch(n)]
        model_tokens = [sum(s.loss_mask) for s in batch]
        return batch, {
            "sft/demos": float(len(batch)),
            "sft/model_tokens_mean": sum(model_tokens) / len(batch),
            "sft/env_tokens_mean": sum(len(s.completion_ids) - k for s, k in zip(batch, model_tokens)) / len(batch),
        }

    def pump(self) -> None:
        """Nothing generates while the learners step (rl/loop/source.py's BatchSource)."""

    def state_dict(self) -> dict:
        return self.data.state_dict()

    def load_state(self, state: dict) -> None:
        self.data.load_state(state)
