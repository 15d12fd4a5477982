"""`bench export RESULT... [--format csv|jsonl] [--per-sample] [--out FILE]`: result files as rows of data.

Long format, one row per case (or per sample, with --per-sample: per rank and repeat) and one per `bench
verify` record, every row with the run's identity, the case's coordinates and its measurements; the
`record` column says which (bench.results.export documents every column). Written to stdout, or to a new
file with --out (never over an existing one; with --replace over an earlier export, never over a result,
history or committed file of another kind, nor one of its inputs: bench.results.outputs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.markup import escape

from bench.console import err_console
from bench.errors import UserError
from bench.results.export import FORMATS, export_rows
from bench.results.names import resolve_result
from bench.results.outputs import check_output_file
from bench.results.paths import replace_file, write_new
from bench.results.store import load_result

NAME = "export"
HELP = "Export result files as rows of data (CSV or JSON Lines): one row per case, sample or verify record."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results",
        nargs="+",
        metavar="RESULT",
        help="result files of `bench run` or `verify` (latest, latest~1, ...: the newest runs in "
        "results_dir)",
    )
    parser.add_argument(
        "--format", choices=sorted(FORMATS), default="csv", help="output format (default csv)"
    )
    parser.add_argument(
        "--per-sample",
        action="store_true",
        help="one row per timed pass of each rank (rank, repeat, sample_s) instead of one per case",
    )
    parser.add_argument("--out", metavar="FILE", help="write to FILE, which must not exist (default: stdout)")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="with --out: replace FILE if it exists (an earlier export; never a result file, one of the "
        "inputs, or a committed file of another kind)",
    )


def main(args: argparse.Namespace) -> int:
    return run(
        args.results, format=args.format, per_sample=args.per_sample, out=args.out, replace=args.replace
    )


def export_text(results: Sequence[str], *, format: str = "csv", per_sample: bool = False) -> str:
    """The rows of the result files, in `format`; UserError for a file that cannot be read."""
    if format not in FORMATS:
        raise UserError(f"--format {format}: unknown format; use one of {', '.join(sorted(FORMATS))}")
    rows = [
        row
        for path in results
        for row in export_rows(load_result(path), Path(path).name, per_sample=per_sample)
    ]
    return FORMATS[format](rows)


def run(
    results: Sequence[str],
    *,
    format: str = "csv",
    per_sample: bool = False,
    out: str | None = None,
    replace: bool = False,
) -> int:
    """Export the files to stdout, or to the new file `out` (`replace`: over an existing one, atomically);
    UserError when `out` exists without `replace`, may not be replaced (bench.results.outputs), or cannot be
    written."""
    if replace and out is None:
        raise UserError("--replace goes with --out FILE (without --out the rows go to stdout)")
    results = [resolve_result(r) for r in results]
    if out is not None:
        check_output_file(out, flag="--out", reading=results, suffixes=(f".{format}",))
    text = export_text(results, format=format, per_sample=per_sample)
    if out is None:
        sys.stdout.write(text)
        return 0
    try:
        if replace:
            replace_file(Path(out), text)
        else:
            write_new(Path(out), text)
    except FileExistsError:
        raise UserError(
            f"--out {out}: the file exists; give another name, or --replace to write over it"
        ) from None
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write it ({exc.strerror}); give another path") from None
    err_console.print(f"wrote {escape(out)}")
    return 0
