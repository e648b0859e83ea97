"""The three registries of rl/algorithms/ (advantage estimators, policy losses, loss aggregations), their
decorators and their lookups by config name.

Apart from the entries so that every entry module registers into one place, and so that a lookup's error (the key,
the unknown name, every valid name) is written once for the three `algorithm.*` keys.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# Metric values are floats or 0-d tensors: a loss returns tensors so that computing them never waits for the device
# (on a GPU a float() between forward and backward stalls the launch queue); the learner converts them once per step
Metrics = dict[str, "float | torch.Tensor"]

ADVANTAGE_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {}
POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, Metrics]]] = {}
LOSS_AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {}


def _register(registry: dict, kind: str, name: str):
    def deco(fn):
        if name in registry:
            raise ValueError(f"{kind} {name!r} is registered twice ({registry[name].__module__} and {fn.__module__})")
        registry[name] = fn
        return fn

    return deco


def register_advantage(name: str):
    return _register(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def register_policy_loss(name: str):
    return _register(POLICY_LOSSES, "policy loss", name)


def register_loss_agg(name: str):
    return _register(LOSS_AGGREGATIONS, "loss aggregation", name)


def _lookup(registry: dict, kind: str, key: str, name: str):
    try:
        return registry[name]
    except KeyError:
        raise KeyError(f"{key}={name!r} is not a known {kind}; valid names: {', '.join(sorted(registry))}") from None


def get_advantage(name: str):
    return _lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", "algorithm.advantage", name)


def get_policy_loss(name: str):
    return _lookup(POLICY_LOSSES, "policy loss", "algorithm.policy_loss", name)


def get_loss_agg(name: str):
    return _lookup(LOSS_AGGREGATIONS, "loss aggregation", "algorithm.loss_agg", name)
