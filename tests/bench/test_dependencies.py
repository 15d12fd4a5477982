"""bench on a node with only torch's usual stack: a missing dependency is one line, for every command,
naming it and the offline install (bench.dependencies, scripts/wheelhouse.py); the tests start without
their optional plugins."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from bench.commands import COMMANDS
from bench.dependencies import OFFLINE_INSTALL, REQUIRED, WHEELHOUSE

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hidden(modules: list[str], code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter where `modules` do not import (as on a node without them)."""
    hide = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run(
        [sys.executable, "-c", hide + code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_checked_dependencies_are_the_projects():
    wheelhouse = _wheelhouse()
    declared = {wheelhouse.requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert declared - {"torch"} == set(REQUIRED.values())


def test_without_pydantic_every_command_is_one_line_naming_it_and_the_offline_install():
    names = [m.NAME for m in COMMANDS]
    code = (
        "from bench.entry import main\n"
        f"codes = [main([name, '--help']) for name in {names!r}] + [main([]), main(['--version'])]\n"
        "print(codes)\n"
    )
    done = _hidden(["pydantic"], code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([1] * (len(names) + 2))
    lines = done.stderr.splitlines()
    assert len(lines) == len(names) + 2 and "Traceback" not in done.stderr
    for line in lines:
        assert line.startswith("error: bench needs pydantic, which is not installed here")
        assert WHEELHOUSE in line and OFFLINE_INSTALL in line


def test_python_m_bench_goes_through_the_same_check():
    done = _hidden(["rich"], "import runpy; runpy.run_module('bench', run_name='__main__')")
    assert done.returncode == 1 and done.stderr.startswith("error: bench needs rich,"), done.stderr


def test_the_wheelhouse_takes_the_projects_requirements_but_the_nodes_own_builds():
    wheelhouse = _wheelhouse()
    (base,) = wheelhouse.requirements(PYPROJECT, []).values()
    names = [wheelhouse.requirement_name(r) for r in base]
    assert "pydantic" in names and "torch" not in names
    files = wheelhouse.requirements(PYPROJECT, ["fla", "dev"])
    assert list(files) == ["requirements.txt", "requirements-fla.txt", "requirements-dev.txt"]
    named = {f: [wheelhouse.requirement_name(r) for r in listed] for f, listed in files.items()}
    assert named["requirements-fla.txt"] == ["fla-core"]  # installed apart from the tests' environment
    assert {"pytest-benchmark", "jsonschema"} <= set(named["requirements-dev.txt"])
    every = [n for listed in named.values() for n in listed]
    assert not {"torch", "triton", "transformers", "ruff"} & set(every) and len(every) == len(set(every))
    with pytest.raises(SystemExit, match="unknown extra 'gpu'"):
        wheelhouse.requirements(PYPROJECT, ["gpu"])


def test_the_tests_start_without_pytest_benchmark_and_jsonschema():
    """A cluster node's pytest: no pytest-benchmark plugin, no jsonschema; the schema test skips, saying
    why."""
    code = (
        "import pytest, sys\n"
        "sys.exit(pytest.main(['-p', 'no:benchmark', '-p', 'no:cacheprovider', '-q', '-rs',\n"
        "    'tests/bench/results/test_schema.py', '-k', 'every_result_file']))\n"
    )
    done = _hidden(["jsonschema"], code)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "skipped" in done.stdout and "jsonschema" in done.stdout, done.stdout[-2000:]
