"""Dataset environments: training prompts from one source, eval sets as a dict name -> source.

Sources are local jsonl/json/parquet files (the chat format of envs/jsonl.py or any rows with a prompt and an answer field) or
Hugging Face Hub datasets (envs/hf.py). Shuffling and sharding are deterministic by seed. Prompts longer than
model.max_prompt_tokens are dropped and counted (rl/data/prompts.py PromptData), never truncated.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from envs.hf import Source, load_rows, row_to_item
from envs.templates import PromptTemplate

log = logging.getLogger(__name__)


class DataEnv:
    """train: a source (path, Hub id, or {path, split, name, prompt_field, answer_field, answer_format, limit}).
    eval_sets: {name: source}, e.g. `'+env.eval_sets={eval_1: /path/eval_1.jsonl}'`; eval items
    carry metadata.eval_set and are interleaved across sets, so a cap on the total keeps every set.
    eval_holdout: move the first N shuffled training items into an eval set named `holdout`.
    template / system_prompt / user_template: see envs/templates.py. strict: a bad jsonl line fails the run
    (false: skipped and counted in `skipped`). seed, shuffle: training order; num_shards, shard_index: keep
    every num_shards-th item starting at shard_index (after shuffling, so shards are disjoint).
    """

    def __init__(
        self,
        train: str | dict[str, Any],
        eval_sets: dict[str, str | dict[str, Any]] | None = None,
        template: str = "boxed",
        system_prompt: str | None = None,
        user_template: str | None = None,
        strict: bool = True,
        seed: int = 0,
        shuffle: bool = True,
        num_shards: int = 1,
        shard_index: int = 0,
        eval_holdout: int = 0,
    ):
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"env.shard_index={shard_index} must be in [0, env.num_shards={num_shards})")
        if eval_holdout < 0:
            raise ValueError(f"env.eval_holdout must be >= 0 training items moved to eval (got {eval_holdout})")
        self.template = PromptTemplate(template, system_prompt=system_prompt, user=user_template)
        self.strict = strict
        self.skipped = 0
        src = Source.of(train, "env.train")
        items = self._load(src, "env.train")
        if shuffle:
            random.Random(seed).shuffle(items)
        self._eval_sets: dict[str, list[dict[str, Any]]] = {}
        if eval_holdout:
            if eval_holdout >= len(items):
                raise ValueError(
                    f"env.eval_holdout={eval_holdout} leaves no training items ({src.path} has {len(items)})"
                )
            self._eval_sets["holdout"], items = items[:eval_holdout], items[eval_holdout:]
        self._train = items[shard_index::num_shards]
        if not self._train:
            raise ValueError(f"env.train: shard {shard_index} of {num_shards} of {src.path} is empty")
        for name, spec in (eval_sets or {}).items():
            self._eval_sets[name] = self._load(Source.of(spec, f"env.eval_sets.{name}"), f"env.eval_sets.{name}")
        for name, rows in self._eval_sets.items():
            for it in rows:
                it["metadata"]["eval_set"] = name
        if self.skipped:
            log.warning("env: skipped %d malformed rows or lines (env.strict=false)", self.skipped)

    def _load(self, src: Source, key: str) -> list[dict[str, Any]]:
        rows, skipped = load_rows(src, strict=self.strict)
        items = []
        for where, row in rows:
            try:
                items.append(row_to_item(row, src, self.template, where, key))
            except ValueError:
                if self.strict:
                    raise
                skipped += 1
        self.skipped += skipped
        if not items:
            why = f" ({skipped} skipped as unreadable: env.strict=true names the first)" if skipped else ""
            raise ValueError(f"{key}: {src.path} has no usable rows{why}")
        return items

    def train_items(self) -> list[dict[str, Any]]:
        return self._train

    def eval_items(self) -> list[dict[str, Any]]:
        """All eval sets, interleaved (a, b, a, b, ...) so that a cap on the total keeps a share of each."""
        out, sets = [], list(self._eval_sets.values())
        for k in range(max((len(s) for s in sets), default=0)):
            out += [s[k] for s in sets if k < len(s)]
        return out
