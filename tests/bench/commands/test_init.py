"""bench from any folder: the packaged bench.yaml and scenarios, `bench init`, and a clear error when a
suite has no scenarios. Subprocesses from a temporary folder, as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.results.store import load_result
from bench.suite.config import SuiteConfig
from bench.suite.loader import PACKAGED_SCENARIOS, PACKAGED_SUITE, load_suite

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = (
    "cpu-smoke",
    "cpu-scaling",
    "cpu-verify",
    "npu-cp4-32k",
    "npu-cp8-scaling",
    "npu-checkpoint-ablation",
)


def bench(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`bench ARGS` in `cwd` (a new process, as from a shell: this environment, passed whole, so that what a
    library of this process set in its C environment alone, readline's COLUMNS, is not inherited)."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


def test_the_packaged_suite_is_the_code_defaults(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    suite = load_suite()
    assert suite.config == SuiteConfig() and suite.path is None and suite.results_dir == tmp_path / "runs"
    assert suite.scenarios_dir == PACKAGED_SCENARIOS and PACKAGED_SUITE.is_file()
    (tmp_path / "scenarios").mkdir()  # a scenarios folder here wins over the packaged one
    assert load_suite().scenarios_dir == tmp_path / "scenarios"


def test_the_repository_uses_the_packaged_scenarios_from_its_root():
    suite = load_suite(ROOT / "bench.yaml")
    assert suite.scenarios_dir.resolve() == PACKAGED_SCENARIOS.resolve() == (ROOT / "scenarios").resolve()
    # one copy of each scenario: none under bench/ in a checkout (a wheel maps scenarios/ there)
    assert not [p for p in (ROOT / "bench").rglob("*.yaml") if p.parent.name == "scenarios"]


def test_list_from_any_folder_shows_the_packaged_scenarios(tmp_path: Path):
    done = bench(tmp_path, "list")
    assert done.returncode == 0, done.stderr
    for name in SHIPPED:
        assert name in done.stdout
    assert "cpu-smoke (default)" in done.stdout


@pytest.mark.multirank
def test_run_from_any_folder_writes_results_here(tmp_path: Path):
    args = ("run", "cpu-smoke", "--filter", "ulysses-cp1-T1024-fwd", "--set", "repeat=1", "--set", "warmup=0")
    done = bench(tmp_path, *args, "--device", "cpu", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = (tmp_path / "runs").glob("*-cpu-smoke.json")
    run = load_result(path)
    assert [c.case.case_id for c in run.cases] == ["ulysses-cp1-T1024-fwd"] and run.cases[0].status == "ok"
    assert run.command == [  # the command line that reproduces the run, its flags in a fixed order
        *("bench", "run", "cpu-smoke", "--set", "repeat=1", "--set", "warmup=0"),
        *("--filter", "ulysses-cp1-T1024-fwd", "--device", "cpu"),
    ]
    assert not list(PACKAGED_SCENARIOS.rglob("*.json"))  # nothing written into the shipped scenarios
    assert not list((ROOT / "bench").rglob("*.json"))  # nor into the package


def test_no_scenarios_is_one_line_naming_where_and_the_fix(tmp_path: Path):
    (tmp_path / "bench.yaml").write_text("device: cpu\n")
    for args in (("list",), ("run", "cpu-smoke")):
        done = bench(tmp_path, *args)
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.count("\n") == 1, done.stderr
        assert "no scenarios: scenarios, the scenarios_dir of bench.yaml, does not exist" in done.stderr
        assert "`bench init FOLDER`" in done.stderr
    (tmp_path / "scenarios").mkdir()
    assert "holds no scenario files (*.yaml)" in bench(tmp_path, "list").stderr


def test_init_writes_the_defaults_and_never_overwrites(tmp_path: Path):
    done = bench(tmp_path, "init")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "bench.yaml").read_text() == PACKAGED_SUITE.read_text()
    written = sorted(p.name for p in (tmp_path / "scenarios").iterdir())
    assert written == sorted(p.name for p in PACKAGED_SCENARIOS.glob("*.yaml"))
    listed = bench(tmp_path, "list")
    assert (
        listed.returncode == 0 and "scenarios (scenarios)" in listed.stdout and "cpu-smoke" in listed.stdout
    )
    (tmp_path / "scenarios" / "cpu-smoke.yaml").write_text("# mine\n")
    again = bench(tmp_path, "init")
    assert again.returncode == 1 and "already there, and `bench init` never overwrites" in again.stderr
    assert (tmp_path / "scenarios" / "cpu-smoke.yaml").read_text() == "# mine\n"
    assert bench(tmp_path, "init", "other").returncode == 0 and (tmp_path / "other" / "bench.yaml").is_file()
