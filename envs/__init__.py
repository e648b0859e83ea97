"""Prompt sources. An environment gives `train_items()` and `eval_items()`: lists of dicts with
`messages` (chat messages), `answer` (ground truth string) and `metadata` (whatever its scorer needs)."""
