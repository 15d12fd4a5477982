"""`bench report RESULT ... --format markdown|html [--out FILE]`: a publishable report of result files.

Sections (bench.render.report): overview, the reference tables, the summary-checkpoint ablation with deltas,
scaling efficiency, the charts, cases not measured, the environment. Markdown links its charts as PNG files
(written by this command into --charts, else <FILE stem>-charts/ beside --out, else a new folder
<results_dir>/plots-<date>-<time>/: the committed plots/ only when named); HTML is one self-contained file
with the charts embedded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape

from bench.commands import common_args
from bench.console import err_console
from bench.errors import UserError
from bench.results.names import resolve_result
from bench.results.outputs import check_output_file, check_output_folder
from bench.results.paths import new_charts_folder
from bench.results.store import load_result
from bench.suite.loader import display, load_suite

NAME = "report"
HELP = (
    "Write a report of result files: reference-shaped tables, checkpoint ablation, scaling efficiency, "
    "environment and charts, as markdown or one self-contained HTML file."
)
FORMATS = {".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html"}
_SUFFIXES = {fmt: tuple(s for s, f in FORMATS.items() if f == fmt) for fmt in ("markdown", "html")}
"""The suffixes of a report in each format: what a committed file may hold to be replaced by one."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results",
        nargs="+",
        metavar="RESULT",
        help="result files written by `bench run` or `verify` (latest, latest~1, ...: the newest runs in "
        "results_dir)",
    )
    parser.add_argument(
        "--format",
        dest="fmt",
        choices=("markdown", "html"),
        default=None,
        help="markdown or html (default: from the --out suffix, else markdown)",
    )
    parser.add_argument("--out", metavar="FILE", help="write the report here (default: standard output)")
    parser.add_argument(
        "--charts",
        metavar="DIR",
        help="markdown only: folder for the chart PNG/SVG files it links (default: <FILE stem>-charts/ "
        "beside --out; without --out, a new folder <results_dir>/plots-<date>-<time>/)",
    )
    common_args.add_config(parser)


def main(args: argparse.Namespace) -> int:
    return run(args.results, fmt=args.fmt, out=args.out, charts=args.charts, config=args.config)


def _format(fmt: str | None, out: str | None) -> str:
    if fmt is not None:
        return fmt
    if out is None:
        return "markdown"
    suffix = Path(out).suffix.lower()
    if suffix not in FORMATS:
        raise UserError(f"--out {out}: cannot tell the format from '{suffix}'; add --format markdown or html")
    return FORMATS[suffix]


def run(
    results: Sequence[str],
    *,
    fmt: str | None = None,
    out: str | None = None,
    charts: str | None = None,
    config: str | None = None,
    stdout: TextIO | None = None,
    console: Console | None = None,
) -> int:
    """Build the report of `results` and write it to `out` (or `stdout`); returns 0."""
    # Imported here: the report draws charts, and matplotlib takes a while to load.
    from bench.render.document import MarkdownCharts, render_html, render_markdown
    from bench.render.report import build_report
    from bench.render.report_run import report_runs

    console = console or err_console
    results = [resolve_result(r, config=config) for r in results]
    if out is not None and Path(out).is_dir():
        raise UserError(
            f"--out {out}: is a folder; give the report's file name, e.g. --out {Path(out) / 'report.md'}"
        )
    fmt = _format(fmt, out)
    if out is not None:  # an earlier report is replaced; a result, history or other committed file never
        check_output_file(out, flag="--out", reading=results, suffixes=_SUFFIXES.get(fmt, ()))
    if fmt == "html" and charts is not None:
        raise UserError("--charts is for markdown (HTML embeds its charts); drop it or use --format markdown")
    if charts is not None:
        check_output_folder(charts, flag="--charts", hint="give a folder for the charts")
    suite = load_suite(config) if fmt == "markdown" and out is None and charts is None else None
    paths = [Path(p) for p in results]
    title, sections = build_report(report_runs([load_result(p) for p in paths], paths))
    out_path = Path(out) if out else None
    if fmt == "html":
        text = render_html(title, sections)
    else:
        base = out_path.parent if out_path else Path.cwd()
        if charts:
            folder = Path(charts)
        elif out_path is not None:
            folder = out_path.parent / f"{out_path.stem}-charts"
        else:
            assert suite is not None
            folder = new_charts_folder(suite.results_dir)
        text = render_markdown(title, sections, MarkdownCharts(folder=folder, relative_to=base))
        if suite is not None and not any(folder.iterdir()):
            folder.rmdir()  # the new folder, unused: no chart could be drawn
        else:
            console.print(f"charts: {escape(display(folder))}", style="dim")
    if out_path is None:
        (stdout or sys.stdout).write(text)
    else:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(text)
        console.print(f"report: {escape(display(out_path))}")
    return 0
