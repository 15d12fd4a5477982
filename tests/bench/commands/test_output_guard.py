"""Every command that writes where it is told to (`--out`, `--output`, `--markdown`, `--save-dir`) goes
through one guard (bench.results.outputs): told to write over a file it reads, or over a result file, it
refuses in one line naming the flag, the file and why, exit 1, before any work, and the file is left as it
was (issue 50: `bench export r.json --out r.json --replace` turned the result file into a CSV)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rich.console import Console

from bench.cli import main
from bench.commands.session import CaseChoice, compared_files
from bench.errors import UserError
from bench.launch.gitrefs import RefSide

FIXTURES = Path(__file__).parents[1] / "fixtures"
READS = "is one of the files this command reads"
RESULT = "is a result file, which no command writes over"
NOT_A_FOLDER = "is a result file, not a folder"


@pytest.fixture
def files(suite_dir: Path) -> tuple[Path, bytes]:
    """r.json, a result file (the ablation fixture), and its bytes; a.json, another one."""
    shutil.copy(FIXTURES / "ablation.json", suite_dir / "r.json")
    shutil.copy(FIXTURES / "ablation.json", suite_dir / "a.json")
    return suite_dir / "r.json", (suite_dir / "r.json").read_bytes()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export", "r.json", "--out", "r.json", "--replace"], f"--out r.json: {READS}; give another name"),
        (["export", "a.json", "--out", "r.json", "--replace"], f"--out r.json: {RESULT}; give another name"),
        (["export", "a.json", "--out", "r.json"], f"--out r.json: {RESULT}; give another name"),
        (["report", "r.json", "--format", "markdown", "--out", "r.json"], f"--out r.json: {READS}; give"),
        (["report", "a.json", "--format", "html", "--out", "r.json"], f"--out r.json: {RESULT}; give"),
        (
            ["plot", "a.json", "--out", "r.json"],
            f"--out r.json: {NOT_A_FOLDER}; give a folder for the charts",
        ),
        (["history", "a.json", "--out", "r.json"], f"--out r.json: {NOT_A_FOLDER}; give a new folder"),
        (
            ["run", "tiny", "--output", "r.json"],
            f"--output r.json: {RESULT}; continue that run with --resume r.json, or give another name",
        ),
        (["verify", "tiny", "--output", "r.json"], f"--output r.json: {RESULT}; give another name"),
        (
            ["profile", "one", "--case", "mode=p2p", "--output", "r.json"],
            f"--output r.json: {NOT_A_FOLDER}; give a folder for the traces",
        ),
        (
            ["model", "calibrate", "--cp", "2", "--output", "r.json"],
            f"--output r.json: {RESULT}; give another --output",
        ),
        (
            ["model", "table", "r.json", "--links", "links.yaml", "--markdown", "r.json"],
            f"--markdown r.json: {READS}; give another --markdown",
        ),
    ],
    ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else None,
)
def test_a_command_never_writes_over_its_input_or_a_result_file(
    suite_dir: Path, files, write_scenario, capsys, argv, message
):
    write_scenario(
        "one", (suite_dir / "scenarios" / "tiny.yaml").read_text().replace("cp: [1, 2]", "cp: [1]")
    )
    path, before = files
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert path.read_bytes() == before


def test_compare_and_gate_save_their_sides_in_a_folder_never_a_file(suite_dir: Path, files):
    """--save-dir (both commands, through compared_files) is checked before any ref runs."""
    sides = [RefSide(spec="main", commit="0" * 40), RefSide(spec="HEAD", commit="1" * 40)]
    path, before = files
    with pytest.raises(UserError) as info:
        compared_files(sides, CaseChoice(), command="compare", save_dir="r.json", console=Console(quiet=True))
    assert str(info.value) == f"--save-dir r.json: {NOT_A_FOLDER}; give a folder for both sides' result files"
    assert path.read_bytes() == before
