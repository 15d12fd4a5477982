"""Terminal output at 80 columns: tables fitted to the width (headers wrapped at spaces, cells never cut or
broken, column groups when too wide), COLUMNS honoured when piped, the status lines' labels explained."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from bench.commands import compare as compare_command
from bench.commands import gate as gate_command
from bench.commands import show
from bench.console import COLUMN_OVERHEAD, fit_columns
from bench.render.formats import CASE_LINE_LEGEND
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
