"""`bench run --commits`: a scenario on each commit of a range, each in a worktree with its own code, one
result file per commit; a broken commit recorded and the range going on; complete commits skipped and a
partial one resumed on the next run. On a real git repository of this project's code (a copy), real ranks."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from gitrepo import git
from rich.console import Console
from tiny import TINY_LAYER_YAML

from bench.cli import main
from bench.commands import commits as commits_command
from bench.commands.history import load_history
from bench.commands.session import CaseChoice
from bench.errors import UserError
from bench.launch.backfill import resolve_commits
from bench.results.history import FAILED_SUFFIX
from bench.results.store import load_result, save_result

ROOT = Path(__file__).resolve().parents[3]
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115
SCENARIO = TINY_LAYER_YAML + (
    "warmup: 0\nrepeat: 1\nrounds: 2\ncp: [1]\nseq_len: [32]\nmode: [p2p]\npass: [forward]\n"
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository of four commits of this code: two alike, one whose bench cannot start, one fixed."""
    repo = tmp_path / "repo"
    for package in ("bench", "gdn_cp"):
        shutil.copytree(ROOT / package, repo / package, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "scenarios").mkdir()
    (repo / "scenarios" / "tiny.yaml").write_text(SCENARIO)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    (repo / "NOTES").write_text("a change outside the code\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "two")
    cli = repo / "bench" / "cli.py"
    good = cli.read_text()
    cli.write_text(good + "\nraise ImportError('broken on purpose')\n")
    git(repo, "commit", "-qam", "broken")
    cli.write_text(good)
    git(repo, "commit", "-qam", "fixed")
    return repo


def test_ranges_and_refs_resolve_oldest_first(repo: Path):
    first = git(repo, "rev-list", "--max-parents=0", "HEAD")
    sides = resolve_commits(repo, [first, f"{first}..HEAD", "HEAD"])
    assert [git(repo, "log", "-1", "--format=%s", s.commit) for s in sides] == [
        "one",
        "two",
        "broken",
        "fixed",
    ]
    with pytest.raises(UserError, match="holds no commit"):
        resolve_commits(repo, ["HEAD..HEAD~1"])
    with pytest.raises(UserError, match="git rev-list failed"):
        resolve_commits(repo, ["nope..HEAD"])


@pytest.mark.multirank
def test_a_backfill_records_every_commit_and_resumes(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(repo)
    first = git(repo, "rev-list", "--max-parents=0", "HEAD")
    history = tmp_path / "history"

    def backfill() -> int:
        specs = [first, f"{first}..HEAD"]
        return commits_command.run_commits(
            CaseChoice(["tiny"]), specs, history_dir=str(history), machine="m", console=QUIET
        )

    assert backfill() == 2  # a commit failed, the others ran
    folder = history / "m" / "tiny"
    commits = git(repo, "rev-list", "--reverse", "HEAD").split()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"{c[:12]}.json" for c in (commits[0], commits[1], commits[3])]
        + [f"{commits[2][:12]}{FAILED_SUFFIX}"]
    )
    (h,) = load_history([folder])
    assert [r.commit.subject for r in h.runs] == ["one", "two", "broken", "fixed"]
    assert h.runs[2].run is None and "broken on purpose" in h.runs[2].error
    assert all(len(r.run.cases[0].rounds) == 2 for r in h.runs if r.run is not None)
    # a commit stopped half-way (its file holds one of two rounds) is resumed, complete ones are skipped
    partial = folder / f"{commits[1][:12]}.json"
    run = load_result(partial)
    run.cases = [dataclasses.replace(c, rounds=c.rounds[:1]) for c in run.cases]
    save_result(run, partial)
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")}
    assert backfill() == 2  # the broken commit is tried again, and fails again
    after = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")}
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {partial.name, f"{commits[2][:12]}{FAILED_SUFFIX}"}
    assert len(load_result(partial).cases[0].rounds) == 2


def test_backfill_flags_need_commits_and_exclude_a_single_file(
    monkeypatch: pytest.MonkeyPatch, repo: Path, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.chdir(repo)
    assert main(["run", "tiny", "--commits", "HEAD~1..HEAD", "--output", "x.json"]) == 1
    assert "drop --output, --resume and --stop-after-round" in capsys.readouterr().err
    assert main(["run", "tiny", "--machine", "m"]) == 1
    assert "--machine and --history-dir go with --commits" in capsys.readouterr().err
