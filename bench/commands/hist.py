"""`bench hist [RESULT] [--case ID ...] [--filter EXPR] [--bins N]`: the distribution of a case's samples,
as pyperf's `hist` prints a benchmark's: every timed pass of every rank, repeat and round in a text
histogram, then each round on one axis with its passes as their rank's digit (bench.render.hist), so that a
bimodal machine is seen where `bench show` gives one estimate and its interval. Every ok case of the file
unless --case or --filter name some; RESULT defaults to the newest run (bench.results.names)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.console import Console

from bench.commands import common_args
from bench.console import console as default_console
from bench.errors import UserError
from bench.render.hist import DEFAULT_BINS, case_histogram
from bench.results.names import find_case, resolve_result
from bench.results.store import load_result
from bench.suite.filters import parse_filters

NAME = "hist"
HELP = "Show the distribution of cases' timed passes (every rank, repeat and round) as text histograms."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_args.add_result(
        parser, "a result file written by `bench run`, or latest, latest~1, ... (default: latest)"
    )
    parser.add_argument(
        "--case",
        dest="cases",
        action="append",
        default=[],
        metavar="ID",
        help="a case id, or scenario/case-id (repeatable; default: every ok case, or those of --filter)",
    )
    common_args.add_filter(
        parser, "keep cases matching field=pattern terms, as `bench run --filter` (e.g. mode=p2p,cp=2)"
    )
    parser.add_argument(
        "--bins",
        type=common_args.integer_at_least(2),
        default=DEFAULT_BINS,
        help=f"histogram bins (default {DEFAULT_BINS})",
    )


def main(args: argparse.Namespace) -> int:
    return run(args.result, cases=args.cases, filters=args.filters, bins=args.bins)


def run(
    result: str,
    *,
    cases: Sequence[str] = (),
    filters: Sequence[str] = (),
    bins: int = DEFAULT_BINS,
    console: Console | None = None,
) -> int:
    """Print the histograms of `result`'s cases (all ok ones, or `cases`, narrowed by `filters`); UserError
    for a file that cannot be read, an unknown case, or no case left to show."""
    console = console or default_console
    result = resolve_result(result)
    loaded = load_result(result)
    chosen = [find_case(loaded, c, result) for c in cases] if cases else [c for c in loaded.cases if c.rounds]
    case_filter = parse_filters(filters)
    chosen = [c for c in chosen if case_filter.matches(c.case)]
    if not chosen:
        narrowed = " after --filter" if filters else ""
        raise UserError(f"{result}: no measured case to show{narrowed}; see `bench show {result}` for why")
    for i, case in enumerate(chosen):
        if i:
            console.print()
        for line in case_histogram(case, console.width, bins):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0
