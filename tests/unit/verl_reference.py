"""verl's own advantage / policy-loss / aggregation functions, loaded without verl's heavy imports.

verl (https://github.com/volcengine/verl, `verl/trainer/ppo/core_algos.py`) is the independent, widely used
implementation the unit tests compare against. Importing it normally pulls in Ray, tensordict, flash-attn and its
worker configs; none of that is needed by the pure functions. So this module reads the installed source files
(`pip install --no-deps -r requirements-dev.txt`) and executes `core_algos.py` against small stand-ins for the
four imports it uses only for typing or config plumbing. The masked statistics it calls (`masked_mean`,
`masked_whiten`, ...) are verl's own code, extracted from `verl/utils/torch_functional.py` with `ast`.
`load()` returns None when verl is not installed; the tests then skip.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

import torch

_MASKED_FNS = ("masked_sum", "masked_mean", "masked_var", "masked_whiten")


class ActorConfig(dict):
    """Stand-in for verl.workers.config.ActorConfig: the attributes the policy losses read."""

    def __init__(self, clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0):
        super().__init__(clip_ratio_c=clip_ratio_c)
        self.clip_ratio, self.clip_ratio_low, self.clip_ratio_high = clip_ratio, clip_ratio_low, clip_ratio_high
        self.global_batch_info: dict = {}


class AlgoConfig(dict):
    pass


def _source_root() -> Path | None:
    spec = importlib.util.find_spec("verl")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _functions_from(path: Path, names: tuple[str, ...]) -> dict:
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    namespace: dict = {"torch": torch}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return {n: namespace[n] for n in names}


_cache: dict = {}


def load() -> types.ModuleType | None:
    if "mod" in _cache:
        return _cache["mod"]
    root = _source_root()
    if root is None:
        _cache["mod"] = None
        return None
    torch_functional = types.ModuleType("verl.utils.torch_functional")
    torch_functional.__dict__.update(_functions_from(root / "utils" / "torch_functional.py", _MASKED_FNS))
    utils = types.ModuleType("verl.utils")
    utils.torch_functional = torch_functional
    utils.as_torch_index = utils.group_mean_std = None  # only used by estimators these tests do not call
    import_utils = types.ModuleType("verl.utils.import_utils")
    import_utils.deprecated = lambda *a, **k: lambda fn: fn
    trainer_config = types.ModuleType("verl.trainer.config")
    trainer_config.AlgoConfig = AlgoConfig
    workers_config = types.ModuleType("verl.workers.config")
    workers_config.ActorConfig = ActorConfig
    stubs = {
        "verl": types.ModuleType("verl"),
        "verl.utils": utils,
        "verl.utils.torch_functional": torch_functional,
        "verl.utils.import_utils": import_utils,
        "verl.trainer.config": trainer_config,
        "verl.workers.config": workers_config,
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location(
            "verl_core_algos_reference", root / "trainer" / "ppo" / "core_algos.py"
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:  # leave sys.modules as it was: nothing else should see the stand-ins
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    _cache["mod"] = mod
    return mod
