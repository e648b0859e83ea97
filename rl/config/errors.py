"""The configuration's one error type and its checks, below every module of the schema (each group raises it)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


class ConfigError(ValueError):
    """A user-facing configuration error; its message names the key and the fix (printed as one line)."""


def check(cond: bool, msg: str) -> None:
    """Raise ConfigError(msg) unless `cond`: every check of the schema (and of the eval command's) is one call."""
    if not cond:
        raise ConfigError(msg)


def check_finite(value: Any, key: str) -> None:
    """Raise ConfigError naming `key` when `value` (or a number inside a list or mapping of it) is NaN or infinite.

    No setting has a use for either, and each slips through a check written the natural way: NaN fails every
    comparison (`timeout_s <= 0` is false, so a NaN timeout passed and then never fired) and infinity passes every
    lower bound. One check for every number, so a range check never has to think of them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value} is not a usable number: give a finite value")
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_finite(item, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, item in value.items():
            check_finite(item, f"{key}.{k}")


def check_fields_finite(group: Any, prefix: str) -> None:
    """`check_finite` on every field of the dataclass `group`, named `prefix.field` (a nested group checks itself):
    the first line of every group's `__post_init__`."""
    for f in dataclasses.fields(group):
        value = getattr(group, f.name)
        if not dataclasses.is_dataclass(value):
            check_finite(value, f"{prefix}.{f.name}" if prefix else f.name)
