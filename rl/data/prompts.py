"""Training and held-out prompts: tokenised once (chat template applied here) and served in a seeded, repeating
order whose position a checkpoint saves. The sampler (rl/loop/sampler.py) is the only reader of the cursor; each
prompt's sampling seed comes from its draw number (rl/seeds.py)."""

from __future__ import annotations

import random
from typing import Any

from rl.config.schema import ConfigError, TrainConfig


class PromptData:
    """Tokenised prompts (chat template applied once, here) and a seeded, repeating order.

    Reads model.use_chat_template, model.max_prompt_tokens and run.seed (the order) from the resolved `cfg`."""

    def __init__(self, items: list[dict], tokenizer: Any, cfg: TrainConfig):
        check_chat_template(tokenizer, cfg)
        self.items, self.prompt_ids, self.dropped = [], [], 0
        for it in items:
            ids = encode_prompt(tokenizer, it["messages"], cfg.model.use_chat_template, it.get("tools"))
            # dropped and counted, never truncated (that would cut the question)
            if len(ids) > cfg.model.max_prompt_tokens:
                self.dropped += 1
                continue
            self.items.append(it)
            self.prompt_ids.append(ids)
        self._rng = random.Random(cfg.run.seed)
        self._order: list[int] = []
        self.cursor = 0  # prompts served so far

    def __len__(self) -> int:
        return len(self.items)

    def next_batch(self, n: int) -> list[int]:
        idx: list[int] = []
        while len(idx) < n:
            if not self._order:
                self._order = list(range(len(self.items)))
                self._rng.shuffle(self._order)
            idx.append(self._order.pop())
            self.cursor += 1
        return idx

    def state_dict(self) -> dict:
        """Cursor and order (the shuffling generator and what is left of the current pass), as plain data."""
        return {
            "n_items": len(self.items),
            "cursor": self.cursor,
            "order": list(self._order),
            "rng": self._rng.getstate(),
        }

    def load_state(self, state: dict) -> None:
        if state["n_items"] != len(self.items):
            raise ConfigError(
                f"the checkpoint was taken with {state['n_items']} training prompts, this run has {len(self.items)}: "
                "resume with the same env and model.max_prompt_tokens"
            )
        self.cursor, self._order = state["cursor"], list(state["order"])
        self._rng.setstate(state["rng"])


def check_chat_template(tokenizer: Any, cfg: TrainConfig) -> None:
    """model.use_chat_template with a tokenizer that has none (a base model, or a folder without its
    chat_template.jinja) fails in one line, not in transformers' apply_chat_template."""
    if cfg.model.use_chat_template and getattr(tokenizer, "chat_template", "") is None:
        raise ConfigError(
            f"the tokenizer of model.path={cfg.model.path} has no chat template (none in its tokenizer_config.json "
            "or chat_template.jinja): set model.use_chat_template=false (the prompt's text as it is), or give a "
            "model whose tokenizer has one"
        )


def encode_prompt(
    tokenizer: Any, messages: list[dict], use_chat_template: bool, tools: list[dict] | None = None
) -> list[int]:
    """The prompt's token ids; `tools` (an env item's JSON schemas) are offered through the chat template."""
    if use_chat_template:
        kwargs = {"tools": tools} if tools else {}
        enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
        return list(enc["input_ids"] if hasattr(enc, "keys") else enc)
    return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]
