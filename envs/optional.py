"""The ecosystem envs' packages (openenv-core, verifiers) are optional installs (`make install-envs`): each env
imports its package when it is built, through `require`, so that resolving a config and `--help` work without it,
and a missing one is the same one line for every env."""

from __future__ import annotations

import importlib
from typing import Any


def require(module: str, env: str, package: str) -> Any:
    """`module` imported, or ImportError with the one line that says how to install `package` for `env=<env>`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"env={env} needs the {package} package: make install-envs (pip install --no-deps -r requirements-envs.txt)"
        ) from None
