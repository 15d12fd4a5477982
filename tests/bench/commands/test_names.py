"""Short names for runs (issue 46: pytest-benchmark's autosave ids, asv's result storage): `latest`,
`latest~N` resolved in one place (bench.results.names) by every command that reads a result file, and a
user's runs in a folder git ignores, never beside the committed baselines in results/."""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from bench.cli import main
from bench.commands import compare as compare_command
from bench.commands import show as show_command
from bench.errors import UserError
from bench.results.names import resolve_result
from bench.results.store import load_result, save_result
from bench.suite.loader import load_suite
from tests.bench.model.test_model import LINKS
from tests.bench.multiround import in_rounds

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parents[1] / "fixtures"
VERIFY = ROOT / "results" / "20261130-082135-main-03c49ffb-verify-cpu-verify.json"


@pytest.fixture
def runs(suite_dir: Path) -> list[Path]:
    """Three `bench run` files in the suite's results_dir, oldest first (two of them written in one second,
    the second numbered), a `bench verify` file newer than all, and a JSON file that is not a result."""
    folder = suite_dir / "runs"
    folder.mkdir()
    base = in_rounds(load_result(FIXTURES / "ablation.json"))
    names = [
        "20261201-100000-main-aaaaaaaa-tiny-ablation.json",
        "20261202-100000-main-bbbbbbbb-tiny-ablation.json",
        "20261202-100000-main-bbbbbbbb-tiny-ablation-2.json",
    ]
    paths = []
    for i, name in enumerate(names):
        env = dataclasses.replace(base.environment, git_commit=f"{i}" * 40)
        save_result(dataclasses.replace(base, environment=env), folder / name)
        paths.append(folder / name)
    shutil.copy(VERIFY, folder / "20261203-100000-main-03c49ffb-verify-cpu-verify.json")
    (folder / "20261204-100000-rows.json").write_text('[{"record": "case"}]')  # an export, not a result
    return paths


def test_latest_and_latest_n_name_the_newest_runs(runs: list[Path]):
    assert resolve_result("latest") == "runs/20261202-100000-main-bbbbbbbb-tiny-ablation.json"
    assert resolve_result("latest~1") == "runs/20261202-100000-main-bbbbbbbb-tiny-ablation-2.json"
    assert resolve_result("latest~2") == "runs/20261201-100000-main-aaaaaaaa-tiny-ablation.json"
    assert (
        resolve_result("latest", kind="verify") == "runs/20261203-100000-main-03c49ffb-verify-cpu-verify.json"
    )
    with pytest.raises(
        UserError, match=r"latest~3: the results folder runs holds 3 `bench run` result files"
    ):
        resolve_result("latest~3")
    # anything else is as given, and a file of that name wins
    assert resolve_result("results/a.json") == "results/a.json" and resolve_result("main~1") == "main~1"
    Path("latest").write_text("{}")
    assert resolve_result("latest") == "latest"


def test_no_run_yet_is_one_clear_line(suite_dir: Path, capsys):
    assert main(["show", "latest"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: latest: the results folder runs does not exist yet, so `latest` names none")
    assert err.count("\n") == 1


def _text(fn) -> str:
    out = io.StringIO()
    fn(Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_every_command_that_reads_a_result_file_takes_the_names(runs: list[Path], capsys, tmp_path):
    newest = _text(lambda c: show_command.run(str(runs[1]), console=c))
    assert _text(lambda c: show_command.run("latest", console=c)) == newest
    assert main(["show"]) == 0  # RESULT defaults to latest
    assert capsys.readouterr().out.split() == newest.split()
    compared = _text(lambda c: compare_command.run("latest~2", "latest", console=c))
    assert "base 20261201-100000-main-aaaaaaaa-tiny-ablation.json" in compared and "~" in compared
    assert main(["export", "latest~1"]) == 0
    assert "20261202-100000-main-bbbbbbbb-tiny-ablation-2.json" in capsys.readouterr().out
    assert main(["history", "latest~2", "latest", "--format", "table"]) == 0
    assert "2 runs" in capsys.readouterr().out
    assert main(["report", "latest", "--out", str(tmp_path / "r.html")]) == 0
    assert main(["plot", "latest", "--out", str(tmp_path / "charts")]) == 0
    assert (tmp_path / "charts" / "strong_scaling.png").is_file()
    capsys.readouterr()
    main(["gate", "latest~1", "latest", "--verify", "latest"])  # --verify latest: the newest verify file
    assert "verify-cpu-verify.json: its checks ran at commit 03c49ffb" in capsys.readouterr().err


def test_a_users_runs_go_where_git_ignores_them_not_beside_the_baselines():
    """The repository's suite writes runs to a folder .gitignore covers, never to the tracked results/ of
    the committed baselines (which stay there, tracked)."""
    folder = load_suite(ROOT / "bench.yaml").results_dir
    assert folder.resolve() != (ROOT / "results").resolve()
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    relative = folder.resolve().relative_to(ROOT)
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", f"{relative}/20261205-120000-main-0123abcd-cpu-smoke.json"],
        cwd=ROOT,
        env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
    )
    assert ignored.returncode == 0, f"{relative}/ is not ignored by git"
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True)
    assert "results/20261201-180404-main-e761a03b-cpu-scaling.json" in tracked.stdout


def test_bench_model_reads_latest_as_every_command_does(suite_dir: Path, capsys):
    """`bench model check latest` (a helper found `bench model` alone took only paths)."""
    (suite_dir / "runs").mkdir()
    shutil.copy(FIXTURES / "scaling.json", suite_dir / "runs" / "20261201-100000-main-aaaaaaaa-s.json")
    links = suite_dir / "links.yaml"
    links.write_text(yaml.safe_dump(LINKS), encoding="utf-8")
    assert main(["model", "check", "latest", "--links", str(links)]) == 0, capsys.readouterr().err
    assert "median absolute error" in capsys.readouterr().out
