"""Terminal output at 80 columns: tables fitted to the width (headers wrapped at spaces, cells never cut or
broken, column groups when too wide), COLUMNS honoured when piped, the status lines' labels explained."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

from bench.commands import compare as compare_command
from bench.commands import gate as gate_command
from bench.commands import history as history_command
from bench.commands import list as list_command
from bench.commands import model as model_command
from bench.commands import show
from bench.console import COLUMN_OVERHEAD, fit_columns, print_path
from bench.formats import CASE_LINE_LEGEND, case_line
from bench.results.store import load_result
from tests.bench.multiround import saved_in_rounds

FIXTURES = Path(__file__).parents[1] / "fixtures"
REPO = Path(__file__).resolve().parents[3]
LONE_MARKER = re.compile(r"│\s*\*\s*│")
"""A noisy-case marker wrapped onto a row of its own."""


def _at_80(fn) -> list[str]:
    out = io.StringIO()
    fn(Console(file=out, width=80, highlight=False, color_system=None))
    return out.getvalue().splitlines()


def _readable(lines: list[str]) -> None:
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert not any("…" in line for line in lines), [line for line in lines if "…" in line]
    assert not any(LONE_MARKER.search(line) for line in lines)


def test_fit_columns_keeps_cells_whole_and_repeats_the_row_names():
    headers = ["mode", "summary ckpt", *(f"metric number {i}" for i in range(6))]
    rows = [["all_gather", "on", *(["1.2345e-06"] * 6)]]
    (whole,) = fit_columns(headers, rows, 200, numeric=range(2, 8))
    assert whole.columns == list(range(8)) and whole.widths is None
    groups = fit_columns(headers, rows, 80, numeric=range(2, 8))
    assert len(groups) > 1 and all(g.columns[:2] == [0, 1] for g in groups)
    assert sorted({c for g in groups for c in g.columns}) == list(range(8))
    for g in groups:
        widths = g.widths or [max(len(headers[c]), len(rows[0][c])) for c in g.columns]
        assert sum(widths) + COLUMN_OVERHEAD * len(widths) + 1 <= 80
        assert all(w >= len(rows[0][c]) for w, c in zip(widths, g.columns, strict=True))


def test_show_reads_at_80_columns():
    lines = _at_80(lambda console: show.run(str(FIXTURES / "scaling.json"), console=console))
    _readable(lines)
    text = "\n".join(lines)
    assert "forward+backward" in text and " * │" in text  # a noisy median keeps its marker on its row
    legend = " ".join(
        " ".join(lines[lines.index(next(x for x in lines if x.startswith("status lines"))) :]).split()
    )
    assert " ".join(CASE_LINE_LEGEND.split()) in legend  # "ranks xN" is explained


def test_wide_tables_split_into_column_groups_at_80_columns():
    lines = _at_80(lambda console: show.run(str(FIXTURES / "verify.json"), console=console))
    _readable(lines)
    assert any("(continued)" in line for line in lines)
    assert sum("worst param (name) rel-L2" in line for line in lines) == 1  # one group holds it, whole


def test_gate_reads_at_80_columns(tmp_path):
    fixture = str(saved_in_rounds(FIXTURES / "ablation.json", tmp_path / "ablation.json"))
    verify = str(FIXTURES / "verify.json")
    lines = _at_80(lambda console: gate_command.run(fixture, fixture, verify=[verify], console=console))
    _readable(lines)
    assert any(line.startswith("gate: pass") for line in lines)
    assert "│ p2p-ckpt-cp2-T64-fwd_bwd " in "\n".join(lines)  # the scenario is said once, in the title


def test_compare_reads_at_80_columns(tmp_path):
    fixture = str(saved_in_rounds(FIXTURES / "ablation.json", tmp_path / "ablation.json"))
    lines = _at_80(lambda console: compare_command.run(fixture, fixture, console=console))
    _readable(lines)
    text = "\n".join(lines)
    assert "head/base ┃" in text and "┃ verdict" in text and "│ p2p-ckpt-cp2-T64-fwd_bwd " in text
    assert any(line.startswith("0 better, 0 worse") for line in lines)


def test_piped_output_takes_its_width_from_columns():
    code = "from bench.console import console; print(console.width)"
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "80"
    env.pop("COLUMNS")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "160"  # a log without COLUMNS: wide, so that case ids are never cut


def _at(width: int, fn) -> list[str]:
    out = io.StringIO()
    fn(Console(file=out, width=width, highlight=False, color_system=None))
    return out.getvalue().splitlines()


def _fits(lines: list[str], width: int) -> None:
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    assert not any("…" in line for line in lines), [line for line in lines if "…" in line]


LINKS = REPO / "results" / "links-gloo-amd-epyc-2core.yaml"


@pytest.mark.parametrize("width", [80, 100])
def test_every_command_fits_the_terminal(width: int, tmp_path: Path):
    """Issue 37: list, show, compare, model, history and the status lines of run and profile, rendered
    at 80 and 100 columns: no line is longer, no cell is cut."""
    scaling = str(saved_in_rounds(FIXTURES / "scaling.json", tmp_path / "scaling.json"))
    views = {
        "list": lambda c: list_command.run(console=c),
        "list SCENARIO": lambda c: list_command.run(["cpu-smoke"], console=c),
        "show": lambda c: show.run(scaling, console=c),
        "compare": lambda c: compare_command.run(scaling, scaling, console=c),
        "model check": lambda c: model_command.run_check([scaling], LINKS, console=c),
        "model table": lambda c: model_command.run_table([scaling], LINKS, console=c),
        "history": lambda c: history_command.run([scaling, scaling], fmt="table", console=c),
    }
    for name, view in views.items():
        lines = _at(width, view)
        assert lines, name
        _fits(lines, width)
    run = load_result(scaling)
    for result in run.cases:  # bench run's status line of every case, its round and this round's time
        line = case_line(result, width, "r2/2 ", ["this round 12.345 ms"])
        plain = Text.from_markup(line).plain.splitlines()
        _fits(plain, width)
        assert result.case.case_id in plain[0]  # the id is never split off its status
    path = "results/profiles/20261204-120000-ulysses-cp4-T32768-fwd_bwd-a-long-folder-name/rank<r>.json"
    lines = _at(width, lambda c: print_path(c, "traces", path, "(open in https://ui.perfetto.dev)"))
    assert path in [line.strip() for line in lines]  # the path on a line of its own, whole
