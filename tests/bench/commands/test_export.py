"""`bench export`: result files as long-format rows (CSV, JSON Lines), per case, per sample, per verify
record; and `bench show --format json`, which prints the same rows."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
from gitrepo import git

from bench.cli import main
from bench.commands import export
from bench.errors import UserError
from bench.results.export import COLUMNS, export_rows, to_csv
from bench.results.store import load_result

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parents[1] / "fixtures"
ABLATION = FIXTURES / "ablation.json"
LAYER_VERIFY = ROOT / "results" / "20261130-082135-main-03c49ffb-verify-cpu-verify.json"
TRAIN_VERIFY = ROOT / "results" / "20261130-082403-main-03c49ffb-verify-train-cpu-verify.json"


def test_case_rows_carry_identity_coordinates_and_measurements():
    run = load_result(ABLATION)
    rows = export_rows(run, "ablation.json")
    assert len(rows) == len(run.cases) and all(list(r) == list(COLUMNS) for r in rows)
    first, result = rows[0], run.cases[0]
    assert first["record"] == "case" and first["file"] == "ablation.json"
    assert first["commit"] == run.environment.git_commit and first["dirty"] == run.environment.git_dirty
    assert first["device_type"] == "cpu" and first["torch_version"] == run.environment.torch_version
    assert first["case_id"] == result.case.case_id and first["pass"] == result.case.pass_
    assert first["local_seq_len"] == result.case.local_seq_len and first["hidden_size"] == 32
    # the time is the estimate, as every table shows it; the pooled statistics are named as such
    assert first["estimate_s"] == result.estimate.median_s and first["low_s"] == result.estimate.low_s
    assert first["rounds"] == len(result.rounds) and first["contended"] is result.contended
    assert first["contended_rounds"] == result.contended_rounds
    assert (
        first["repeats_median_s"] == result.timing.median_s
        and first["peak_bytes"] == result.memory.peak_bytes
    )
    assert first["overlap"] == result.case.overlap and first["precision"] == result.case.precision
    assert first["threads_per_rank"] == result.threads_per_rank
    (failed,) = [r for r in rows if r["status"] == "failed"]
    assert failed["estimate_s"] is None and failed["repeats_median_s"] is None and failed["rounds"] is None
    assert "MemoryError: injected" in failed["error"]


def test_per_sample_rows_are_one_per_round_rank_and_repeat():
    run = load_result(ABLATION)
    rows = export_rows(run, per_sample=True)
    ok = [c for c in run.cases if c.samples_s]
    assert len(rows) == sum(len(s) for c in ok for s in c.samples_s) + (len(run.cases) - len(ok))
    assert {r["record"] for r in rows} == {"sample"}
    result = ok[-1]
    last = [r for r in rows if r["case_id"] == result.case.case_id]
    assert [(r["round"], r["rank"], r["repeat"]) for r in last] == [
        (number, rank, rep)
        for number in range(len(result.rounds))
        for rank in range(result.case.cp)
        for rep in range(result.case.repeat)
    ]
    assert last[-1]["sample_s"] == result.samples_s[-1][-1]


def test_verify_records_are_rows_of_their_own():
    layer = export_rows(load_result(LAYER_VERIFY))
    assert layer and {r["record"] for r in layer} == {"verify"} and {r["check"] for r in layer} == {"layer"}
    assert all(
        r["passed"] in (True, False) and r["worst_rel_l2"] is not None for r in layer if r["status"] == "ok"
    )
    train = export_rows(load_result(TRAIN_VERIFY))
    assert {r["check"] for r in train} == {"train"} and all(r["steps"] == 20 for r in train)
    assert all(r["worst_loss_rel"] is not None and r["estimate_s"] is None for r in train)


def test_csv_and_jsonl_through_the_cli(capsys):
    assert main(["export", str(ABLATION), str(TRAIN_VERIFY)]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert tuple(table[0]) == COLUMNS
    assert {r["record"] for r in table} == {"case", "verify"}
    assert {r["file"] for r in table} == {ABLATION.name, TRAIN_VERIFY.name}
    assert main(["export", str(ABLATION), "--format", "jsonl", "--per-sample"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(json.loads(line)["record"] == "sample" for line in lines)


def test_out_writes_a_new_file_and_never_overwrites(tmp_path: Path, capsys):
    out = tmp_path / "rows.csv"
    assert main(["export", str(ABLATION), "--out", str(out)]) == 0
    assert out.read_text() == to_csv(export_rows(load_result(ABLATION), ABLATION.name))
    assert main(["export", str(ABLATION), "--out", str(out)]) == 1
    assert "the file exists; give another name, or --replace to write over it" in capsys.readouterr().err
    # told by name, it replaces the file whole (issue 37: there was no way to)
    out.write_text("stale\n")
    assert main(["export", str(ABLATION), "--format", "jsonl", "--out", str(out), "--replace"]) == 0
    assert next(json.loads(line)["file"] for line in out.read_text().splitlines()) == ABLATION.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv"]  # no temporary file left
    assert main(["export", str(ABLATION), "--replace"]) == 1  # --replace needs --out
    with pytest.raises(UserError, match="unknown format"):
        export.export_text([str(ABLATION)], format="xml")


def test_replace_never_turns_a_result_file_into_rows(tmp_path: Path, capsys):
    """Issue 50: `bench export r.json --out r.json --replace` exited 0 and left a CSV where the result file
    was. Its input, or any result file, is refused in one line; the file stays a result file."""
    result = tmp_path / "r.json"
    shutil.copy(ABLATION, result)
    before = result.read_bytes()
    for argv, why in [
        (
            ["export", str(result), "--out", str(result), "--replace"],
            "is one of the files this command reads",
        ),
        (["export", str(ABLATION), "--out", str(result), "--replace"], "is a result file, which no command"),
    ]:
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out {result}: {why}") and err.count("\n") == 1, err
    assert result.read_bytes() == before and load_result(result).cases


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_replace_writes_over_a_committed_export_but_not_a_committed_baseline(tmp_path: Path, capsys):
    """A committed file is replaced only by its own kind: rows over the committed rows.csv, never over the
    committed report (results/cpu-scaling-baseline.md's kind)."""
    git(tmp_path, "init", "-q")
    (tmp_path / "rows.csv").write_text("old rows\n")
    (tmp_path / "baseline.md").write_text("# a report\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "baselines")
    assert main(["export", str(ABLATION), "--out", str(tmp_path / "rows.csv"), "--replace"]) == 0
    assert (tmp_path / "rows.csv").read_text().startswith("record,")
    assert main(["export", str(ABLATION), "--out", str(tmp_path / "baseline.md"), "--replace"]) == 1
    err = capsys.readouterr().err
    assert (
        "baseline.md: is committed to git (a baseline), and this command would replace it with a .csv" in err
    )
    assert (tmp_path / "baseline.md").read_text() == "# a report\n"


def test_show_json_prints_the_export_rows(capsys):
    assert main(["show", str(ABLATION), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == export_rows(load_result(ABLATION), ABLATION.name)
