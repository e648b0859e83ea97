"""What the entry scripts (train.py, `python -m rl.tools.eval`, `python -m rl.tools.demos`) share: composing a config
and turning a config or build error into the one line the user reads (`error: ...`, exit 2), and building the
`_target_` nodes (env, reward) with an error naming the key, and the SIGTERM handler of train.py and the slurm
launcher (`on_sigterm`). It imports only Hydra and OmegaConf, so the scripts' `--help` stays instant.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sys
import typing
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig


def fail(msg: str, code: int = 2) -> NoReturn:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# A scheduler's stop (SIGTERM: a time limit's warning, preemption, `scancel --signal=TERM`) reaches every process of
# the job, the run's Ray workers and daemons too; whatever fails in the run after it is the stop's doing.
_stop_requested = False


def on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM ends a run as Ctrl-C does (torn down, then the `interrupted: ...` line): the first raises
    KeyboardInterrupt; a repeated one (a scheduler signals again) leaves the teardown alone."""
    global _stop_requested
    if not _stop_requested:
        _stop_requested = True
        raise KeyboardInterrupt


def stop_requested() -> bool:
    """Whether this process got SIGTERM (`on_sigterm`)."""
    return _stop_requested


def writable_folder(path: Path, key: str) -> None:
    """Create the output folder `key` names, before anything starts, or exit with one line: a file in its place, or a
    folder this user cannot create or write (else the run or evaluation would fail when it writes its results)."""
    if path.exists() and not path.is_dir():
        fail(f"{key}={path} is a file: give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, "not writable")
    except OSError as e:
        fail(f"{key}={path}: cannot write there ({e.strerror}): give a folder this user can create and write")


# Keys that moved into groups: the old spelling, on the command line or in a YAML file, fails with one line naming
# the new one.
RENAMED = {
    **{k: f"run.{k}" for k in ("seed", "steps", "prompts_per_step", "deterministic", "verbose", "output_dir")},
    **{k: f"run.{k}" for k in ("resume", "max_nonfinite_steps", "sync_probe_threshold")},
    **{
        k: f"learner.{k}" for k in ("micro_batch_size", "micro_batch_tokens", "packed_attention", "share_prompt_prefix")
    },
    **{f"eval_{k}": f"eval.{k}" for k in ("size", "interval", "n_samples", "temperature", "pass_k", "save_dir")},
    "eval_correct_threshold": "eval.correct_threshold",
    "save_interval": "checkpoint.interval",
    "keep_last": "checkpoint.keep_last",
    "rollout_save_interval": "logger.rollouts_interval",
    "rollout_save_dir": "logger.rollouts_dir",
}


def renamed_hint(key: str) -> str | None:
    """The one line for a key that moved into a group, or None."""
    new = RENAMED.get(key)
    return f"'{key}' is now '{new}': write {new}=... (python -m rl.tools.keys lists every key)" if new else None


def check_renamed(overrides: list[str]) -> None:
    """Fail with one line when a command-line override uses a key's old spelling (`steps=3` -> `run.steps=3`)."""
    for arg in overrides:
        key = arg.lstrip("+~").split("=", 1)[0]
        hint = renamed_hint(key)
        if hint:
            fail(hint)


def one_line_config_error(e: BaseException, schema: type) -> str:
    """Hydra/OmegaConf composition errors span several lines; keep what names the key and the fix. `schema` is the
    config dataclass the composed config validates into (its field names are the valid keys offered)."""
    cause = e.__cause__ or e
    text = str(cause)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    full_key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), None)
    if " not in '" in text and full_key and renamed_hint(full_key):  # an old spelling in a YAML file
        return renamed_hint(full_key)
    if " not in '" in text and full_key:
        return unknown_key_line(full_key, schema)
    if "is not in struct" in text and full_key:  # reward/env: a `_target_`'s keyword arguments, not a schema
        group, _, rest = full_key.partition(".")
        # the rewards scored in worker processes (rewards.runner.RewardRunner) hold their own under reward.reward
        inner = f" (a reward scored in workers takes its own as {group}.reward.{rest})" if group == "reward" else ""
        return (
            f"{full_key}: no such key in the {group} config: check its spelling, or add an argument its _target_ "
            f"takes with +{full_key}=...{inner}"
        )
    if full_key:
        return f"{full_key}: {lines[0]}"
    if "Could not find" in text:  # a group option that does not exist
        after = next((i + 1 for i, ln in enumerate(lines) if ln.startswith("Available options")), len(lines))
        end = next((i for i, ln in enumerate(lines) if ln.startswith("Config search path")), len(lines))
        head = lines[0].split(": ", 1)[1] if lines[0].startswith("In '") else lines[0]
        return f"{head}; available: {', '.join(lines[after:end])}"
    return " ".join(lines[:2]) if lines else type(e).__name__


def unknown_key_line(full_key: str, schema: type, how: str = "") -> str:
    """The one line for a key the schema lacks, with the keys its group does have."""
    valid = valid_keys(full_key, schema)
    hint = f"; valid keys there: {', '.join(valid)}" if valid else ""
    return f"unknown config key '{full_key}'{how}: check its spelling{hint}"


def valid_keys(full_key: str, schema: type) -> list[str]:
    """The field names of the schema node that should have held `full_key`."""
    node: object = schema
    for part in full_key.split(".")[:-1]:
        node = typing.get_type_hints(node).get(part) if dataclasses.is_dataclass(node) else None
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []


def added_key_error(cfg: DictConfig, schema: type, prefix: str = "") -> str | None:
    """The one line for a key that `+key=value` added to a typed group (`+algorithm.clip_hig=0.3`), or None. Hydra
    lets `+` append to a structured config, and the typed object then drops the key: the value would be ignored."""
    from omegaconf import OmegaConf

    node_type = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(node_type):  # reward/env: a `_target_`'s keyword arguments, any keys
        return None
    fields = {f.name for f in dataclasses.fields(node_type)}
    for key in cfg.keys():
        full_key = f"{prefix}{key}"
        if key not in fields:
            return unknown_key_line(full_key, schema, how=" (added with +)")
        child = cfg._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none():
            error = added_key_error(child, schema, f"{full_key}.")
            if error:
                return error
    return None


def compose_config(conf_dir: str, name: str, overrides: list[str], schema: type) -> DictConfig:
    """conf_dir/name.yaml with `overrides`, composed by Hydra; a group option or key that does not exist (also one
    added with `+` to a typed group), or a value of the wrong type, raises ConfigError with one line naming it.
    `schema` must be registered with Hydra's ConfigStore already."""
    from hydra import compose, initialize_config_dir

    from rl.config.errors import ConfigError

    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            cfg = compose(config_name=name, overrides=overrides)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - Hydra/OmegaConf errors become one line
        raise ConfigError(one_line_config_error(e, schema)) from None
    error = added_key_error(cfg, schema)
    if error:
        raise ConfigError(error)
    return cfg


def compose_checked(
    conf_dir: str, name: str, overrides: list[str], schema: type, where: str = "", fill: dict[str, Any] | None = None
) -> tuple[DictConfig, Any]:
    """`compose_config`, and the result's typed and checked `schema` object: (the DictConfig, the object); a bad key
    or value exits with one line naming it (after `where`, e.g. which sweep job). `fill`: values for keys the
    composed config leaves null, as the run will set them (a sweep job's run.output_dir: its own directory)."""
    from omegaconf import OmegaConf

    from rl.config.errors import ConfigError

    try:
        dcfg = compose_config(conf_dir, name, overrides, schema)
        checked = dcfg.copy()
        for key, value in (fill or {}).items():
            if OmegaConf.select(checked, key) is None:
                OmegaConf.update(checked, key, value)
        return dcfg, OmegaConf.to_object(checked)  # typed validation (__post_init__ checks)
    except ConfigError as e:
        fail(f"{where}{e}")
    except Exception as e:  # noqa: BLE001 - Hydra/OmegaConf errors become one line
        fail(f"{where}{one_line_config_error(e, schema)}")


def sweep_jobs(conf_dir: str, overrides: list[str]) -> list[list[str]] | None:
    """The overrides of each job a `-m` sweep of `overrides` launches, in its order, as Hydra's basic sweeper lists
    them (comma lists, range(), a glob over a group's options; a key given twice keeps its last value), or None
    where only a sweeper plugin could (an interval): Hydra then checks each job as it starts it. An override Hydra
    cannot parse raises ConfigError with its one line."""
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, OverrideParseException

    from rl.config.errors import ConfigError

    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        try:
            parsed = parser.parse_overrides(overrides)
        except OverrideParseException as e:
            raise ConfigError(" ".join(str(e).split())) from None
        try:
            jobs = BasicSweeper.split_arguments(parsed, max_batch_size=None)[0]
        except HydraException:  # a sweep type only a sweeper plugin expands
            return None
        for o in parsed:
            if o.is_discrete_sweep() and not list(o.sweep_string_iterator()):
                key = o.get_key_element().lstrip("+~")
                options = GlobalHydra.instance().config_loader().get_group_options(key)
                known = f"; available: {', '.join(options)}" if options else ""
                raise ConfigError(f"{o.input_line} sweeps over nothing: no value matches{known}")
    return jobs


def build_target(node: DictConfig, key: str) -> Any:
    """Instantiate a `_target_` config node (env, reward) with a one-line error naming the key: its arguments' numbers
    pass the schema's finiteness check first (rl/config/errors.py), then each constructor checks its own ranges. A
    nested node that fails (a runner's `reward.reward`) is named with its own key and class."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rl.config.errors import ConfigError, check_finite

    if "_target_" not in node:
        fail(f"{key} has no _target_: pick one of conf/{key}/*.yaml or give {key}._target_=module.Callable")
    try:
        check_finite(OmegaConf.to_container(node, resolve=True, throw_on_missing=False), key)
    except ConfigError as e:
        fail(str(e))
    except Exception:  # noqa: BLE001 - an interpolation that does not resolve: instantiate names it below
        pass
    try:
        return instantiate(node, _convert_="all")
    except Exception as e:  # noqa: BLE001
        cause = e.__cause__ or e
        first = str(cause).splitlines()[0] if str(cause) else ""
        text = str(e)
        nested = text.split("full_key: ", 1)[1].split()[0] if "full_key: " in text else key
        target = text.split("'", 2)[1] if text.startswith("Error in call to target '") else node._target_
        fail(f"{nested}: could not build {target}: {type(cause).__name__}: {first}")
