"""`bench show RESULT`: a result file as the PR's tables (mode | forward median | forward+backward median |
peak allocated, per CP degree and sequence length), the throughput table, packed documents against the same
tokens unpacked (when the run has both), then the cases that failed or were skipped, with why,
then the accuracy checks of `bench verify`, if the file holds any. `--case ID` prints one case in full: what
was asked, what ran as gdn_cp recorded it, the correctness gate's checks (bench.measure.gate) and its
figures (bench.render.case_detail). `--format markdown` renders the same
tables as a markdown document (bench.render.document); `--format json` prints the file's cases as the rows
of `bench export` (bench.results.export)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from bench.commands import common_args
from bench.console import console as default_console
from bench.errors import UserError
from bench.render.case_detail import case_detail
from bench.render.run_tables import markdown, render
from bench.results.export import export_rows
from bench.results.names import find_case, resolve_result
from bench.results.store import load_result

NAME = "show"
HELP = "Show a result file as tables shaped like the reference PR's (per CP degree and sequence length)."
FORMATS = ("text", "markdown", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_args.add_result(
        parser,
        "a result file written by `bench run`, or latest, latest~1, ... (the newest in results_dir, the one "
        "before it, ...; default: latest)",
    )
    parser.add_argument(
        "--case",
        metavar="ID",
        default=None,
        help="one case in full: what was asked, what ran (as gdn_cp recorded it), the correctness gate's "
        "checks and its figures (a case id, or scenario/case-id)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text: tables for the terminal (default); markdown: the same tables as a markdown document; "
        "json: the file's cases as rows of data (those of `bench export`)",
    )


def main(args: argparse.Namespace) -> int:
    return run(args.result, format=args.format, case=args.case)


def run(result: str, *, format: str = "text", case: str | None = None, console: Console | None = None) -> int:
    """Print `result` in `format` (FORMATS), or its case `case` in full; UserError if it cannot be read or
    holds no such case."""
    console = console or default_console
    result = resolve_result(result)
    loaded = load_result(result)
    if case is not None:
        for line in case_detail(find_case(loaded, case, result)):
            console.print(line, markup=False, highlight=False)
        return 0
    if format == "text":
        render(loaded, console)
    elif format == "markdown":
        console.out(markdown(loaded), end="", highlight=False)
    elif format == "json":
        rows = export_rows(loaded, Path(result).name)
        console.out(json.dumps(rows, indent=1), highlight=False)
    else:
        raise UserError(f"--format {format}: unknown format; use one of {', '.join(FORMATS)}")
    return 0
