"""YAML holds values, the schema holds defaults: no file of conf/ (train.yaml, cluster/, model/, algorithm/,
logger/) restates a default of rl/config/schema.py, and the demo (`python train.py`, no overrides) is the schema's defaults.

A restated default is a second copy that drifts (train.yaml said `steps: 24` while the schema said 20): change the
default in rl/config/schema.py, or state the key only where the option differs from it. reward/, env/ and experiment/ are
`_target_` and override files, not checked here. An algorithm bundle keeps `name:` (its label in logs and sweeps)
even when it equals the default.
"""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from rl.config.cluster import ClusterConfig
from rl.config.schema import AlgorithmConfig, CurriculumConfig, LoggerConfig, ModelConfig, TrainConfig, register_configs
from tests.helpers import REPO

CONF = REPO / "conf"
SCHEMAS = {
    "model": ModelConfig,
    "algorithm": AlgorithmConfig,
    "cluster": ClusterConfig,
    "logger": LoggerConfig,
    "curriculum": CurriculumConfig,
}
ALWAYS_STATED = {"algorithm": {"name"}}  # keys an option states even when they equal the default
NOT_VALUES = {"defaults", "hydra"}  # train.yaml keys that are Hydra's, not the schema's
register_configs()


def restated_defaults(stated: list[str], composed: DictConfig, schema: type, keep: set[str] = frozenset()) -> list[str]:
    """The keys of `stated` whose composed value equals the schema default (`composed` is the node the file
    merged into, so YAML `1` and a float default 1.0, or `ray` and ClusterMode.ray, compare as the schema types)."""
    default = OmegaConf.structured(schema)
    return [k for k in stated if k not in keep and k in default and composed[k] == default[k]]


def yaml_files() -> list[str]:
    """Every checked file, relative to conf/."""
    return ["train.yaml"] + [f"{g}/{f.name}" for g in SCHEMAS for f in sorted((CONF / g).glob("*.yaml"))]


def compose_with(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


@pytest.mark.parametrize("name", yaml_files())
def test_yaml_states_only_values_that_differ_from_the_schema(name):
    raw = OmegaConf.load(CONF / name) or {}
    stated = list(raw)
    if "/" in name:  # a group option, composed as `python train.py group=option` would
        group, option = name.removesuffix(".yaml").split("/")
        node, schema = compose_with([f"{group}={option}"])[group], SCHEMAS[group]
        keep = ALWAYS_STATED.get(group, set())
    else:
        node, schema, keep = compose_with([]), TrainConfig, NOT_VALUES
    restated = restated_defaults(stated, node, schema, keep)
    assert not restated, (
        f"conf/{name} restates defaults of rl/config/schema.py {schema.__name__}: "
        + ", ".join(f"{k}: {raw[k]}" for k in restated)
        + "; delete these lines, or change the default in rl/config/schema.py if the demo should use this value"
    )


def test_restated_defaults_compares_as_the_schema_types():
    composed = OmegaConf.merge(
        OmegaConf.structured(ClusterConfig), {"mode": "ray", "cpus_per_actor": 1, "num_actors": 2, "address": None}
    )
    assert restated_defaults(["mode", "cpus_per_actor", "num_actors", "address"], composed, ClusterConfig) == [
        "mode",
        "cpus_per_actor",
        "address",
    ]
    algo = OmegaConf.merge(OmegaConf.structured(AlgorithmConfig), {"name": "grpo", "filter_range": [0.01, 0.99]})
    assert restated_defaults(["name", "filter_range"], algo, AlgorithmConfig, {"name"}) == ["filter_range"]


def test_the_demo_is_the_schema_defaults():
    """`python train.py` with no overrides composes to TrainConfig() (reward and env aside: `_target_` nodes)."""
    cfg = compose_with([])
    cfg.reward, cfg.env = {}, {}
    demo = OmegaConf.to_object(cfg)
    differ = {
        f"{part}.{f.name}" if part else f.name
        for part, node, default in [
            ("", demo, TrainConfig()),
            *((g, getattr(demo, g), getattr(TrainConfig(), g)) for g in SCHEMAS),
        ]
        for f in dataclasses.fields(node)
        if f.name not in SCHEMAS and getattr(node, f.name) != getattr(default, f.name)
    }
    assert not differ, f"the demo's config differs from rl/config/schema.py's defaults at {sorted(differ)}"
