"""bench on a node with only torch's usual stack: a missing dependency is one line, for every command,
naming it and the offline install (bench.dependencies, scripts/wheelhouse.py); a dependency present but
broken (its import raises) is one line naming it and its error, wherever a command first imports it, at no
cost to start-up; the tests start without their optional plugins."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.commands import COMMANDS
from bench.dependencies import OFFLINE_INSTALL, REQUIRED, WHEELHOUSE, import_failure

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


FIXTURE = ROOT / "tests" / "bench" / "fixtures" / "ablation.json"
LIBOPENBLAS = "libopenblas.so.0: cannot open shared object file: No such file or directory"


def _with_broken(tmp_path: Path, package: str, raising: str, *argv: str) -> subprocess.CompletedProcess:
    """`python -m bench ARGV` with a `package` first on the path whose import runs `raising` (present but
    broken, as a scipy built against a libopenblas the node lacks)."""
    fake = tmp_path / "site" / package
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(raising + "\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "bench", *argv],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=env,
    )


def test_a_broken_dependency_is_one_line_naming_it_and_its_error(tmp_path: Path):
    """Issue 50: a scipy whose import raises gave 40 lines of traceback from `bench show`."""
    done = _with_broken(tmp_path, "scipy", f"raise ImportError({LIBOPENBLAS!r})", "show", str(FIXTURE))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        f"error: bench cannot import scipy: it is installed ({tmp_path / 'site' / 'scipy'})"
    )
    assert (
        f"but its import fails (ImportError: {LIBOPENBLAS}); reinstall it: pip install --force-reinstall"
        in line
    )
    # --help imports no command, so neither scipy: it works as before
    done = _with_broken(tmp_path / "help", "scipy", f"raise ImportError({LIBOPENBLAS!r})", "--help")
    assert done.returncode == 0 and done.stderr == "" and "COMMAND" in done.stdout, done.stderr


def test_a_broken_dependency_a_command_imports_late_is_one_line_too(tmp_path: Path):
    """matplotlib loads only when a chart is drawn (the start-up imports keep it out): its import failing
    there, of a package it needs, is the same one line."""
    done = _with_broken(
        tmp_path, "matplotlib", "import kiwisolver_gone", "plot", str(FIXTURE), "--out", "charts"
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: bench cannot import matplotlib: it is installed (")
    assert "(ModuleNotFoundError: No module named 'kiwisolver_gone')" in line


def test_an_import_error_of_benchs_own_code_keeps_its_traceback():
    """Only a dependency's failure is turned into the line: bench's own import errors are bugs to fix."""
    try:
        import bench.no_such_module  # noqa: F401
    except ImportError as exc:
        assert import_failure(exc) is None
    # a name a dependency lacks (another version of it) names the dependency
    lacking = ImportError("cannot import name 'binomtest' from 'scipy.stats'", name="scipy.stats")
    assert import_failure(lacking).startswith("bench cannot import scipy: it is installed (")


def test_bench_help_imports_no_heavy_dependency():
    """The start-up budget: `bench --help` (and the dependency check before it) imports neither torch nor
    matplotlib nor scipy; docs/results.md gives the import counts."""
    code = (
        "import sys\nfrom bench.entry import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('torch', 'matplotlib', 'scipy', 'numpy', 'pydantic')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_wheelhouse_takes_the_projects_requirements_but_the_nodes_own_builds():
    wheelhouse = _wheelhouse()
    base = wheelhouse.requirements(PYPROJECT, [])["requirements.txt"]
    names = [wheelhouse.requirement_name(r) for r in base]
    assert "pydantic" in names and "torch" not in names
    files = wheelhouse.requirements(PYPROJECT, ["fla", "dev"])
    assert list(files) == [
        "requirements.txt",
        "requirements-fla.txt",
        "requirements-dev.txt",
        "requirements-build.txt",  # the build backend, for `pip install -e .` offline (issue 45)
    ]
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
