"""No import cycles between the project's modules (rl/, rewards/, envs/, train.py), no import that runs back up a
layer (LAYERS), and the whole config (`TrainConfig`) named only at the wiring points, never by the roles and the loop.

Read from the source with `ast`, nothing is imported (fast, no torch). Every import counts: at module level and
inside functions (a lazy import hides a cycle from Python's import machinery, not from the design). `from rl import
x` is the module rl.x when rl/x.py or rl/x/ exists, else the package rl; relative imports are resolved against the
importing module's package. A cycle is reported as `a -> b -> a`, with the file and line of each import.

Read the same way: every module (bench/ too) says at its top why it exists, past 400 lines why it is that big, and
none is over 500 lines; and no test module imports another (shared test code is in tests/helpers.py and
tests/fakes.py, which do not import bench/).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rl", "rewards", "envs")
SCRIPTS = ("train.py",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files() -> dict[str, Path]:
    """module name -> file, for every .py file of the scanned packages and scripts."""
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    files += [ROOT / s for s in SCRIPTS]
    return {module_name(p): p for p in files if "__pycache__" not in p.parts}


def is_module(name: str) -> bool:
    """True when `name` is a module or package of this repository (a .py file or a folder)."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def deepest_module(name: str) -> str | None:
    """The longest prefix of the dotted `name` that is a project module (`rl.tools.plot.main` -> `rl.tools.plot`)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if is_module(candidate):
            return candidate
    return None


def is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":`: what runs only when the file is the program, never when it is imported."""
    return isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


def imported_modules(module: str, path: Path, *, skip_main_guard: bool = False) -> list[tuple[str, int]]:
    """(project module, line) for every import statement anywhere in the file (with `skip_main_guard`, but those
    under a top-level `if __name__ == "__main__":`)."""
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int]] = []
    tree = ast.parse(path.read_text(), filename=str(path))
    if skip_main_guard:
        tree.body = [node for node in tree.body if not is_main_guard(node)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: `from . import x`, `from ..y import z`
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from pkg import x` imports the module pkg.x when it exists, else a name defined in pkg
            targets = [
                f"{source}.{a.name}" if a.name != "*" and is_module(f"{source}.{a.name}") else source
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES + tuple(Path(s).stem for s in SCRIPTS):
                resolved = deepest_module(target)
                if resolved and resolved != module:
                    found.append((resolved, node.lineno))
    return found


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """module -> the project modules it imports, and (a, b) -> "file:line" of the first such import."""
    files = project_files()
    graph: dict[str, set[str]] = {m: set() for m in files}
    where: dict[tuple[str, str], str] = {}
    for module, path in files.items():
        for target, line in imported_modules(module, path):
            if target in files:
                graph[module].add(target)
                where.setdefault((module, target), f"{path.relative_to(ROOT)}:{line}")
    return graph, where


def find_cycles(graph: dict[str, set[str]], limit: int = 100) -> list[list[str]]:
    """Elementary cycles, each as [a, b, ..., a] starting at its smallest module name (each cycle once)."""
    cycles: list[list[str]] = []

    def walk(start: str, path: list[str], on_path: set[str]) -> None:
        for nxt in sorted(graph[path[-1]]):
            if len(cycles) >= limit:
                return
            if nxt == start:
                cycles.append(path + [start])
            elif nxt > start and nxt not in on_path:
                on_path.add(nxt)
                walk(start, path + [nxt], on_path)
                on_path.discard(nxt)

    for start in sorted(graph):
        walk(start, [start], {start})
    return cycles


def test_graph_covers_the_project():
    """The scan itself: a module known to import another (at top level) is in the graph, so an empty cycle list
    does not just mean an empty graph."""
    graph, _ = import_graph()
    assert "rl.config.schema" in graph and "train" in graph
    assert "rl.config.schema" in graph["train"]  # `from rl.config.schema import ...` at module level


def test_every_import_form_is_resolved(tmp_path):
    """Absolute, `from pkg import module`, relative and function-level imports, read as if in rl/tools/fake.py."""
    source = tmp_path / "fake.py"
    source.write_text(
        "import json\n"
        "import rl.tools.plot\n"
        "from rl import config\n"
        "from rl import ConfigError_not_a_module\n"
        "from rl.types import Sampling\n"
        "from . import sweep\n"
        "from ..loop.checkpoint import save\n"
        "def later():\n"
        "    from rewards import math\n"
    )
    found = [m for m, _ in imported_modules("rl.tools.fake", source)]
    assert found == [
        "rl.tools.plot",
        "rl.config",
        "rl",
        "rl.types",
        "rl.tools.sweep",
        "rl.loop.checkpoint",
        "rewards.math",
    ]


def test_find_cycles_on_a_small_graph():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c", "a"}, "e": set()}
    assert find_cycles(graph) == [["a", "b", "a"], ["a", "b", "c", "d", "a"], ["c", "d", "c"]]


def test_no_import_cycles():
    graph, where = import_graph()
    cycles = find_cycles(graph)
    lines = [" -> ".join(c) + "  (" + ", ".join(where[(a, b)] for a, b in zip(c, c[1:])) + ")" for c in sorted(cycles)]
    assert not cycles, f"{len(cycles)} import cycle(s) between project modules:\n" + "\n".join(lines)


def test_every_module_says_why_it_exists_and_past_400_lines_why_it_is_that_big():
    files = [*project_files().values(), *sorted((ROOT / "bench").rglob("*.py"))]
    missing, big = [], []
    for path in files:
        source = path.read_text()
        if not source.strip():
            continue  # an empty __init__.py only marks a package
        doc, lines = ast.get_docstring(ast.parse(source)), source.count("\n")
        if not doc:
            missing.append(str(path.relative_to(ROOT)))
        elif lines > 400 and "400 lines" not in doc:
            big.append(f"{path.relative_to(ROOT)} ({lines} lines)")
    assert not missing, f"modules without a docstring saying why they exist: {missing}"
    assert not big, f"modules past 400 lines whose docstring does not say why (a sentence with '400 lines'): {big}"


def test_no_module_is_over_500_lines():
    files = [*project_files().values(), *sorted((ROOT / "bench").rglob("*.py"))]
    over = [f"{p.relative_to(ROOT)} ({n} lines)" for p in files if (n := p.read_text().count("\n")) > 500]
    assert not over, f"modules over 500 lines (split one along a seam a reader can name): {over}"


# The layers of the project, lowest first: a module may import its own layer and those below, never one above. A
# module belongs to the layer of its longest listed prefix (exactly the name, or the name followed by a dot).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # the environments and the sandbox: nothing of rl/ (the schema's `sandbox` group is envs/sandbox.py's)
    ("envs", ("envs",)),
    # the ground floor: the schema, plain data that crosses processes, errors, small helpers without a role
    (
        "ground",
        (
            "rl",
            "rl.config",
            "rl.types",
            "rl.errors",
            "rl.seeds",
            "rl.atomic",
            "rl.flat",
            "rl.logs",
            "rl.metrics",
            "rl.run_files",
        ),
    ),
    # inputs and pure functions the roles and the loop share: prompts and data, losses and advantages, weights on
    # disk, the rewards
    ("inputs", ("rl.data", "rl.algorithms", "rl.model_path", "rewards")),
    ("roles", ("rl.rollout", "rl.learner")),  # each role's plain class, no Ray
    ("runtime", ("rl.runtime",)),  # the roles driven as one, and the only Ray
    ("loop", ("rl.loop",)),  # one training step's parts, in the order the driver calls them
    ("resolve", ("rl.resolve",)),  # the one resolve step, above what it reads
    # the commands: a run (train.py, rl/app.py, the roles' wiring), its CLI, the preflight, the user tools
    (
        "commands",
        (
            "train",
            "rl.app",
            "rl.pack",  # a sweep's jobs as one pack of adapters: above the run it starts once per pack
            "rl.entry",
            "rl.preflight",
            "rl.tools",
            "rewards.check",  # `python -m rewards.check`: the reward gate's command name, forwarding to rl/tools
        ),
    ),
]


def layer_of(module: str) -> int:
    """The index in LAYERS of `module`'s longest listed prefix (KeyError when none: a new top-level name is placed)."""
    best, found = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), index
    if found is None:
        raise KeyError(f"{module} is in no layer of tests/unit/test_imports.py LAYERS: place it")
    return found


def test_layer_of_takes_the_longest_prefix():
    assert LAYERS[layer_of("rl.loop.driver")][0] == "loop"
    assert LAYERS[layer_of("rl.config.schema")][0] == "ground"
    assert LAYERS[layer_of("rewards.math")][0] == "inputs"
    assert LAYERS[layer_of("rewards.check")][0] == "commands"
    assert LAYERS[layer_of("rl")][0] == "ground"


def test_no_import_runs_back_up_a_layer():
    """Every module is in a layer, and each of its imports (lazy ones too) reaches its own layer or one below."""
    graph, where = import_graph()
    for module in graph:
        layer_of(module)  # placed
    up = [
        f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})  {where[(a, b)]}"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if layer_of(b) > layer_of(a)
    ]
    assert not up, "imports that run back up a layer:\n" + "\n".join(up)


# Where the whole config is read and handed out as its groups and named values: the roles' wiring (rl/app.py) and the
# loop's (rl/loop/driver.py `train`). Below them, a part takes what it uses.
WIRING_POINTS = ("rl.loop.driver",)
NO_WHOLE_CONFIG = ("rl.rollout", "rl.learner", "rl.runtime", "rl.loop", "rl.data")


def names_train_config(path: Path) -> list[int]:
    """Lines where a module imports `TrainConfig` or reaches it as an attribute (`schema.TrainConfig`)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and any(a.name == "TrainConfig" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "TrainConfig":
            lines.append(node.lineno)
    return lines


def test_names_train_config_reads_imports_and_attributes(tmp_path):
    source = tmp_path / "fake.py"
    source.write_text(
        "from rl.config.schema import ModelConfig, TrainConfig\nimport rl.config.schema as s\nx = s.TrainConfig\n"
    )
    assert names_train_config(source) == [1, 3]


def test_the_roles_runtime_and_loop_parts_never_take_the_whole_config():
    """Nothing under the roles', the runtime's, the loop's and the data's packages names TrainConfig (the loop's
    wiring point aside): what a role or loop part reads is in its signature, and what crosses a process is small."""
    files = project_files()
    found = [
        f"{files[m].relative_to(ROOT)}:{line}"
        for m in sorted(files)
        if m.startswith(tuple(p + "." for p in NO_WHOLE_CONFIG) + NO_WHOLE_CONFIG) and m not in WIRING_POINTS
        for line in names_train_config(files[m])
    ]
    assert len([m for m in files if m.startswith(NO_WHOLE_CONFIG)]) > 20  # the scan saw those packages
    assert not found, f"TrainConfig named below the wiring points: {found}"


def imported_by(start: str, graph: dict[str, set[str]]) -> set[str]:
    """Every project module `start` imports, directly or through others (any import, lazy ones included)."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_training_loop_never_imports_preflight():
    """Preflight (the memory plan, start-up diagnosis, install check) stays out of the training path: the loop, the
    roles and the runtime reach none of it; rl/app.py asks it to explain a failed start, from outside the loop."""
    graph, _ = import_graph()
    for start in (
        "rl.loop.driver",
        "rl.learner.learner",
        "rl.rollout.vllm",
        "rl.runtime.runtime",
        "rl.runtime.placement",
    ):
        reached = imported_by(start, graph)
        assert start in graph and reached, start
        assert not [m for m in reached if m.startswith("rl.preflight")], f"{start} reaches {sorted(reached)}"


def test_envs_and_rewards_do_not_import_rl():
    """Layers: the environments and the rewards sit below the run's machinery (rl/); a command that needs both lives
    in rl/tools/ (rewards/check.py only names the reward-hacking gate, under its `__main__` guard)."""
    up = [
        f"{module} -> {target} ({path.relative_to(ROOT)}:{line})"
        for module, path in project_files().items()
        if module.split(".")[0] in ("envs", "rewards")
        for target, line in imported_modules(module, path, skip_main_guard=True)
        if target.split(".")[0] == "rl"
    ]
    assert not up, up


def test_a_main_guard_is_left_out_only_when_asked(tmp_path):
    source = tmp_path / "cmd.py"
    source.write_text("import rl.types\nif __name__ == '__main__':\n    from rl.tools import eval\n")
    assert [m for m, _ in imported_modules("rewards.cmd", source)] == ["rl.types", "rl.tools.eval"]
    assert [m for m, _ in imported_modules("rewards.cmd", source, skip_main_guard=True)] == ["rl.types"]


def test_envs_do_not_import_rewards():
    """Layers: rewards may use envs (the sandbox, the code tasks), never the other way round."""
    graph, where = import_graph()
    up = [
        f"{a} -> {b} ({where[(a, b)]})"
        for a in graph
        if a.startswith("envs")
        for b in graph[a]
        if b.startswith("rewards")
    ]
    assert not up, up


def modules_named(path: Path) -> list[tuple[str, int]]:
    """(dotted name, line) of every absolute import in the file, function-level ones too; `from pkg import x` names
    pkg.x (a module or a name in pkg: either way, what is imported comes from pkg)."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def test_modules_named(tmp_path):
    """The scan below, on a test file with every form of import of another test module and of the shared helpers."""
    source = tmp_path / "test_fake.py"
    source.write_text(
        "from tests.unit.test_async import run_loop\n"
        "import tests.integration.test_train_ray\n"
        "from tests.unit import test_plan, verl_reference\n"
        "from tests.helpers import REPO\n"
        "def later():\n"
        "    from tests.fakes import FakeActor\n"
    )
    assert modules_named(source) == [
        ("tests.unit.test_async.run_loop", 1),
        ("tests.integration.test_train_ray", 2),
        ("tests.unit.test_plan", 3),
        ("tests.unit.verl_reference", 3),
        ("tests.helpers.REPO", 4),
        ("tests.fakes.FakeActor", 6),
    ]


def test_no_test_module_imports_another_test_module():
    """Shared test code lives in tests/helpers.py, tests/fakes.py and conftest.py: a test module that imports
    another runs that module's imports (and skips) and ties the two together."""
    crossing = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        for name, line in modules_named(path)
        if name.startswith("tests.") and any(part.startswith("test_") for part in name.split("."))
    ]
    assert not crossing, "move what is shared to tests/helpers.py or tests/fakes.py:\n" + "\n".join(crossing)


def test_the_shared_test_helpers_do_not_import_benchmarks():
    """The benchmarks may use the test helpers (the tiny model, the child environment), not the other way round."""
    shared = [ROOT / "tests" / name for name in ("helpers.py", "fakes.py", "conftest.py")]
    up = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in shared
        for name, line in modules_named(path)
        if name == "bench" or name.startswith("bench.")
    ]
    assert not up, up
