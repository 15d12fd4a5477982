"""scripts/wheelhouse.py: the folder an offline node installs from holds the build backend too, so that
`pip install -e .` (the `bench` command) works there with every index off (issue 45), and what the node
builds itself is never downloaded. pip is replaced by a recorder here: .ci/run's offline environment
(scripts/offline_node.sh) builds a real wheelhouse and installs from it."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="scripts/wheelhouse.py needs Python 3.11 (tomllib)")
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
assert _spec is not None and _spec.loader is not None
wheelhouse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheelhouse)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_build_backend_and_its_editable_needs_are_carried():
    files = wheelhouse.requirements(PYPROJECT, ["fla", "dev"])
    build = files["requirements-build.txt"]
    assert build[0] == PYPROJECT["build-system"]["requires"][0]  # hatchling>=1.26
    assert "editables" in build  # hatchling asks for it to build `pip install -e .`
    assert files["requirements-fla.txt"] == ["fla-core>=0.6,<0.7"]
    listed = {wheelhouse.requirement_name(r) for f in files.values() for r in f}
    assert not listed & wheelhouse.NODE_BUILDS  # torch, triton, transformers: the node's own


def test_the_download_takes_every_requirement_and_excludes_the_node_builds(tmp_path, monkeypatch):
    seen: list[list[str]] = []
    monkeypatch.setattr(wheelhouse.subprocess, "run", lambda command, check: seen.append(command))
    assert wheelhouse.main(["--dest", str(tmp_path), "--python", "3.11", "--extra", "dev"]) == 0
    (command,) = seen
    assert command[command.index("--python-version") + 1] == "3.11"
    for requirement in ("hatchling>=1.26", "editables", "pydantic>=2.11", "pytest>=8.0"):
        assert requirement in command
    constraints = Path(command[command.index("--constraint") + 1])
    assert constraints.parent == tmp_path
    assert set(constraints.read_text().split()) == {f"{n}<0" for n in wheelhouse.NODE_BUILDS}
    assert (tmp_path / "requirements-build.txt").read_text() == "hatchling>=1.26\neditables\n"


def test_a_failed_download_is_one_line_naming_the_node_builds(tmp_path, monkeypatch):
    def fail(command, check):
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(wheelhouse.subprocess, "run", fail)
    with pytest.raises(SystemExit) as stopped:
        wheelhouse.main(["--dest", str(tmp_path)])
    message = str(stopped.value.code)
    assert message.startswith("error: pip could not fill the wheelhouse") and "\n" not in message
    assert "torch, torch-npu, transformers, triton" in message
