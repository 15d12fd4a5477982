"""The shape of the code (docs/architecture.md): imports run one way, with no cycle, and a CP mode's name
is spelled only where the registry and the modes live.

Imports are read from the source (ast), top-level and inside functions alike; TYPE_CHECKING blocks are
left out, since they never run.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from bench.commands import COMMANDS
from gdn_cp.distributed import MODES, ModeName
from gdn_cp.distributed.modes import MODE_CLASSES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gdn_cp", "bench")

LAYERS: dict[str, tuple[tuple[str, ...], ...]] = {
    # lowest first; a module may import its own layer and the ones below it, never one above. A package's
    # own name holds only its __init__: every other module is on a floor named here
    "gdn_cp": (
        ("gdn_cp.dtypes",),
        ("gdn_cp.ops",),
        ("gdn_cp.layers",),
        ("gdn_cp.distributed",),
        ("gdn_cp.models", "gdn_cp.accuracy"),
        ("gdn_cp",),
    ),
    "bench": (
        # the ground floor: the vocabulary of every floor above, the one way to print a case among it
        ("bench.errors", "bench.console", "bench.records", "bench.formats", "bench.dependencies"),
        ("bench.suite",),
        ("bench.measure",),
        ("bench.results",),
        ("bench.judge",),
        ("bench.launch",),
        # what runs on ranks beside `bench run`'s cases: verify's, profile's, the cost model's calibration,
        # the doctor's checks
        ("bench.verification", "bench.profiling", "bench.model", "bench.doctor"),
        ("bench.render",),
        ("bench.commands",),
        # the ways in: the command line, the console script, `python -m bench`, bench run for Python
        ("bench.cli", "bench.entry", "bench.__main__", "bench.api", "bench"),
    ),
}
"""docs/architecture.md draws the same map."""

LAZY_FOR_START_UP = {
    ("bench.commands.report", "bench.render"),
    ("bench.commands.plot", "bench.render"),
    ("bench.commands.history", "bench.render"),
    ("bench.commands.run", "bench.render"),
}
"""Function-level imports kept for start-up time (matplotlib loads only when a chart is drawn), each with
a comment saying so at the import. No other project import may sit inside a function."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _without_type_checking(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    return tree


@cache
def _imports() -> dict[str, list[tuple[str, bool]]]:
    """module -> [(imported project module, at top level)]; `from pkg import sub` counts as `pkg.sub`."""
    modules = _modules()
    out: dict[str, list[tuple[str, bool]]] = {}
    for name, path in modules.items():
        tree = _without_type_checking(ast.parse(path.read_text()))
        top = {id(n) for n in tree.body}
        found = []
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            found += [(t, id(node) in top) for t in targets if t in modules and t != name]
        out[name] = found
    return out


def _floor(module: str) -> int | None:
    """The floor of `module` in LAYERS: that of the longest name holding it (a package's own name holds
    only its __init__); None when no name does."""
    holding = [
        (len(name), i)
        for i, group in enumerate(LAYERS[module.split(".")[0]])
        for name in group
        if module == name or ("." in name and _within(module, name))
    ]
    return max(holding)[1] if holding else None


def _layer(module: str) -> int:
    floor = _floor(module)
    assert floor is not None, f"{module} is on no floor of LAYERS"
    return floor


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_on_a_named_floor(package: str) -> None:
    """Issue 47: bench.model, bench.doctor, bench.api and bench.dependencies fell into the catch-all floor
    of the package's own name, so nothing constrained what they import. Every module's floor is named in
    LAYERS, and every name there is a module or package that exists (a moved one leaves no stale name)."""
    modules = [m for m in _modules() if m.split(".")[0] == package]
    assert not [m for m in modules if _floor(m) is None]
    named = [name for group in LAYERS[package] for name in group]
    assert not [name for name in named if name not in modules]


def test_no_import_cycles() -> None:
    graph = {m: {t for t, _ in imports} for m, imports in _imports().items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, [" -> ".join(c) for c in cycles]


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_never_go_up_a_layer(package: str) -> None:
    upward = [
        f"{module} imports {target}"
        for module, imports in _imports().items()
        if module.split(".")[0] == package
        for target, _ in imports
        if target.split(".")[0] == package and _layer(target) > _layer(module)
    ]
    assert not upward, upward


def test_no_function_level_project_imports_but_the_start_up_ones() -> None:
    lazy = {
        (module, target)
        for module, imports in _imports().items()
        for target, top in imports
        if not top and not any(module == m and _within(target, t) for m, t in LAZY_FOR_START_UP)
    }
    assert not lazy, sorted(lazy)


def test_ops_has_no_torch_distributed() -> None:
    for path in (ROOT / "gdn_cp" / "ops").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
            assert not any(_within(n, "torch.distributed") for n in names), (path, names)


MAY_SPELL_A_MODE: dict[str, str] = {
    "gdn_cp.distributed.comm_stats": "two collective kinds it counts share a mode's name (all_gather)",
}
"""Modules outside gdn_cp/distributed/modes/ allowed to spell a mode's name as a string, each with why."""


def test_mode_names_live_in_the_registry() -> None:
    """ModeName lists the registered modes in order, and outside the modes' folder only the modules of
    MAY_SPELL_A_MODE spell a mode name as a string: a mode's facts live in its class."""
    assert MODES == tuple(ModeName.__args__) == tuple(MODE_CLASSES)
    modes_dir = ROOT / "gdn_cp" / "distributed" / "modes"
    spelling = set()
    for name, path in _modules().items():
        if modes_dir in path.parents:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        if any(
            isinstance(n, ast.Constant) and n.value in MODES and id(n) not in docstrings
            for n in ast.walk(tree)
        ):
            spelling.add(name)
    assert spelling == set(MAY_SPELL_A_MODE), sorted(spelling)


def test_no_command_imports_another() -> None:
    """A command module (one with NAME, bench.commands.COMMANDS) imports only the commands' shared
    modules (common_args, session, commits), never another command: what two commands share lives once."""
    commands = {m.__name__ for m in COMMANDS}
    crossing = [
        f"{module} imports {target}"
        for module, imports in _imports().items()
        if module in commands
        for target, _ in imports
        if target in commands
    ]
    assert not crossing, crossing


@pytest.mark.parametrize("package", ["gdn_cp", "bench"])
def test_the_tests_mirror_the_packages(package: str) -> None:
    """Each package of gdn_cp and bench has its tests in the same place under tests/ (tests/gdn_cp/ops for
    gdn_cp/ops; a subpackage's tests live with its parent's): a module's tests are found by its name."""
    packages = sorted(p.parent.name for p in (ROOT / package).glob("*/__init__.py"))
    missing = [p for p in packages if not any((ROOT / "tests" / package / p).glob("test_*.py"))]
    assert not missing, f"no tests/{package}/<name>/test_*.py for these packages: {missing}"
