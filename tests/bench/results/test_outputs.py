"""bench.results.outputs: the one guard of what a command writes where it is told to. A file the command
reads, a result file, a history file and a committed file of another kind are never written over; an
ordinary file, a folder or a new name pass (the command's own rule decides those)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from gitrepo import git

from bench.errors import UserError
from bench.results.history import FAILED_SUFFIX
from bench.results.outputs import check_output_file, check_output_folder, committed, protected_kind
from bench.results.store import save_result
from tests.bench.results.test_store import new_run


def test_a_file_the_command_reads_is_refused_however_it_is_spelled(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.csv").write_text("a,b\n")
    os.symlink(tmp_path / "rows.csv", tmp_path / "link.csv")
    for spelled in ("rows.csv", "./rows.csv", str(tmp_path / "rows.csv"), "link.csv"):
        with pytest.raises(UserError) as info:
            check_output_file(spelled, flag="--out", reading=["rows.csv"])
        reads = "is one of the files this command reads"
        assert str(info.value) == f"--out {spelled}: {reads}; give another name"
    assert check_output_file("other.csv", flag="--out", reading=["rows.csv"]) == Path("other.csv")


def test_result_and_history_files_are_never_written_over(tmp_path: Path):
    result = tmp_path / "r.json"
    save_result(new_run(), result)
    cut = tmp_path / "cut.json"
    cut.write_text(result.read_text()[:40])  # a result file cut short (a full disk) is still one
    failure = tmp_path / f"0123456789ab{FAILED_SUFFIX}"
    failure.write_text(json.dumps({"commit": "0123", "error": "x"}))
    for path, kind in [(result, "a result file"), (cut, "a result file"), (failure, "a history file")]:
        with pytest.raises(UserError, match=rf"^--out {path}: is {kind}.*, which no command writes over; x"):
            check_output_file(path, flag="--out", suffixes=(".json",), hint="x")
    # JSON that is not a result file, a CSV, a large file that is no JSON object: ordinary files
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": [], "schemaVersion": 1}))
    (tmp_path / "rows.csv").write_text("record,schema_version\n" * 10_000)
    for name in ("trace.json", "rows.csv", "missing.csv"):
        assert protected_kind(tmp_path / name) is None
        assert check_output_file(tmp_path / name, flag="--out") == tmp_path / name


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_committed_file_is_replaced_only_by_its_own_kind(tmp_path: Path):
    """`bench report --out results/cpu-scaling-baseline.md` regenerates the committed report; an export over
    it, or over the committed links file, is refused. Files git does not track are the command's."""
    git(tmp_path, "init", "-q")
    (tmp_path / "report.md").write_text("# a baseline\n")
    (tmp_path / "links.yaml").write_text("name: gloo\n")
    git(tmp_path, "add", "report.md", "links.yaml")
    git(tmp_path, "commit", "-q", "-m", "baselines")
    (tmp_path / "draft.md").write_text("not committed\n")
    assert committed(tmp_path / "report.md") and not committed(tmp_path / "draft.md")
    assert check_output_file(tmp_path / "report.md", flag="--out", suffixes=(".md", ".markdown"))
    for name in ("report.md", "links.yaml"):
        with pytest.raises(UserError, match=r"is committed to git \(a baseline\), and this command would"):
            check_output_file(tmp_path / name, flag="--out", suffixes=(".csv",))
    assert check_output_file(tmp_path / "draft.md", flag="--out", suffixes=(".csv",))
    assert not committed(Path("/") / "no-such-file.md")  # outside any checkout


def test_an_output_folder_that_is_a_file_says_what_the_file_is(tmp_path: Path):
    save_result(new_run(), tmp_path / "r.json")
    (tmp_path / "chart.png").write_bytes(b"\x89PNG")
    with pytest.raises(UserError) as info:
        check_output_folder(tmp_path / "r.json", flag="--out", hint="give a folder for the charts")
    assert str(info.value) == (
        f"--out {tmp_path / 'r.json'}: is a result file, not a folder; give a folder for the charts"
    )
    with pytest.raises(UserError, match=r"chart.png: is a file; give a folder$"):
        check_output_folder(tmp_path / "chart.png", flag="--out", hint="give a folder")
    assert check_output_folder(tmp_path, flag="--out", hint="") == tmp_path
    assert check_output_folder(tmp_path / "new", flag="--out", hint="") == tmp_path / "new"
