"""Training and held-out prompts: tokenised once (chat template applied here) and served in a seeded, repeating
order whose position a checkpoint saves. The sampler (rl/loop/sampler.py) is the only reader of the cursor; each
prompt's sampling seed comes from its draw number (rl/seeds.py). Also how an env's messages become tokens after a
model turn (`EnvTokens`: a multi-turn episode's, rl/rollout/episodes.py, and a demonstration's, rl/data/demos.py)."""

from __future__ import annotations

import random
from typing import Any

from rl.config.errors import ConfigError
from rl.config.schema import ModelConfig


class PromptData:
    """Tokenised prompts (chat template applied once, here) and a seeded, repeating order.

    Reads model.use_chat_template and model.max_prompt_tokens from the resolved `model` group; `seed` (run.seed)
    seeds the order."""

    def __init__(self, items: list[dict], tokenizer: Any, model: ModelConfig, *, seed: int):
        check_chat_template(tokenizer, model)
        self.items, self.prompt_ids, self.dropped = [], [], 0
        for it in items:
            ids = encode_prompt(tokenizer, it["messages"], model.use_chat_template, it.get("tools"))
            # dropped and counted, never truncated (that would cut the question)
            if len(ids) > model.max_prompt_tokens:
                self.dropped += 1
                continue
            self.items.append(it)
            self.prompt_ids.append(ids)
        self._rng = random.Random(seed)
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


MARK = "<<rlft-model-turn>>"  # stands for a model turn when the env's messages are rendered (see EnvTokens)


class EnvTokens:
    """Token ids of the env's messages as they follow a model turn in the chat template.

    Re-rendering the whole conversation and taking the new suffix would break on templates that render earlier
    turns differently once a later one exists (Qwen3 drops an earlier answer's reasoning, some templates move tool
    results): the prefix would no longer match the tokens the model saw. So only the delta is rendered: a fixed
    stand-in conversation (a user message, an assistant turn whose content is MARK) followed by the env's messages
    and the generation prompt; the text after MARK is the template's end of the assistant turn, the env's messages
    and the start of the next assistant turn. The model's own end-of-turn token (its EOS, which it generated) is
    taken off the front when the text starts with it, so the closing is not doubled. Without a chat template the
    messages are joined by newlines, as `encode_prompt` joins a prompt's."""

    def __init__(self, tokenizer: Any, use_chat_template: bool):
        self.tokenizer, self.use_chat_template = tokenizer, use_chat_template

    def encode(self, messages: list[dict], last_token: int | None, tools: list[dict] | None = None) -> list[int]:
        if not self.use_chat_template:
            text = "\n" + "\n".join(str(m["content"]) for m in messages) + "\n"
        else:
            stand_in = [{"role": "user", "content": "."}, {"role": "assistant", "content": MARK}]
            kwargs = {"tools": tools} if tools else {}
            rendered = self.tokenizer.apply_chat_template(
                stand_in + list(messages), tokenize=False, add_generation_prompt=True, **kwargs
            )
            text = rendered[rendered.index(MARK) + len(MARK) :]
            if last_token is not None:
                own = self.tokenizer.decode([last_token])
                if own and text.startswith(own):
                    text = text[len(own) :]
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def check_chat_template(tokenizer: Any, model: ModelConfig) -> None:
    """model.use_chat_template with a tokenizer that has none (a base model, or a folder without its
    chat_template.jinja) fails in one line, not in transformers' apply_chat_template."""
    if model.use_chat_template and getattr(tokenizer, "chat_template", "") is None:
        raise ConfigError(
            f"the tokenizer of model.path={model.path} has no chat template (none in its tokenizer_config.json "
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
