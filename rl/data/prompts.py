"""Training and held-out prompts: tokenised once (chat template applied here) and served in a seeded, repeating
order whose position a checkpoint saves. The sampler (rl/data/sampler.py) is the only reader of the cursor. Also the
sampling seed of each prompt's request (`prompt_seed`), derived from where the prompt sits in the run."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from rl.config.schema import ConfigError
from rl.config.resolve import DataSpec


class PromptData:
    """Tokenised prompts (chat template applied once, here) and a seeded, repeating order."""

    def __init__(self, items: list[dict], tokenizer: Any, spec: DataSpec):
        self.items, self.prompt_ids, self.dropped = [], [], 0
        for it in items:
            ids = encode_prompt(tokenizer, it["messages"], spec.use_chat_template, it.get("tools"))
            if len(ids) > spec.max_prompt_tokens:  # dropped and counted, never truncated (that would cut the question)
                self.dropped += 1
                continue
            self.items.append(it)
            self.prompt_ids.append(ids)
        self._rng = random.Random(spec.seed)
        self._order: list[int] = []
        self.cursor = 0  # prompts served so far

    def __len__(self) -> int:
        return len(self.items)

    def next_batch(self, n: int) -> list[int]:
        idx = []
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


SEED_BITS = 62  # vLLM seeds the k-th of a request's n samples with seed + k: room above for that, within int64


def prompt_seed(run_seed: int, index: int, stream: str = "train", step: int = 0) -> int:
    """The sampling seed of one prompt's generate request (it fixes all G samples of the prompt: vLLM seeds its
    k-th sample with seed + k, rl/rollout/hf.py seeds the prompt's batch with it), so a prompt's samples depend
    on the run seed and the prompt's place in the run, never on the actor, the batch or the call it lands in.

    Training (`stream="train"`): `index` is the prompt's draw number in the data stream (the data cursor before
    it was drawn), unique over the run, repeated passes included; `step` stays 0 because a batch's step is not
    fixed when it is drawn (bounded staleness sends batches ahead, a dynamic-sampling round takes the next batch
    of the queue), while its draw numbers are, also after a resume. Fixed prompt sets sampled again at every step
    (`stream="eval"`, `"probe"`): `index` is the prompt's position in the set and `step` the step.
    A hash (not seed + index) keeps the streams of different prompts, steps and runs apart."""
    key = f"{run_seed}/{stream}/{step}/{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> (64 - SEED_BITS)


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The sampling seed of a multi-turn episode's later turn (turn >= 1): from its prompt's seed, its sample index
    in the prompt's group and the turn, so each turn's tokens depend on the episode alone (rl/rollout/episodes.py)."""
    return prompt_seed(seed, sample, f"turn{turn}")


def encode_prompt(
    tokenizer: Any, messages: list[dict], use_chat_template: bool, tools: list[dict] | None = None
) -> list[int]:
    """The prompt's token ids; `tools` (an env item's JSON schemas) are offered through the chat template."""
    if use_chat_template:
        kwargs = {"tools": tools} if tools else {}
        enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
        return list(enc["input_ids"] if hasattr(enc, "keys") else enc)
    return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]
