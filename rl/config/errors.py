"""The configuration's one error type and its check, below every module of the schema (each group raises it)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing configuration error; its message names the key and the fix (printed as one line)."""


def check(cond: bool, msg: str) -> None:
    """Raise ConfigError(msg) unless `cond`: every check of the schema (and of the eval command's) is one call."""
    if not cond:
        raise ConfigError(msg)
