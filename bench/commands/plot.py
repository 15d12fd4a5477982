"""`bench plot RESULT ... [--out DIR]`: the scaling charts of result files, as PNG and SVG
(bench.render.plots).

Several files overlay as series (e.g. two branches). File names are stable (time_vs_seq.png, ...), so a
README can embed them; a chart the results cannot support is skipped with a one-line note.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from bench.commands import common_args
from bench.console import console as default_console
from bench.errors import UserError
from bench.results.store import load_result
from bench.suite.loader import display, load_suite

NAME = "plot"
HELP = (
    "Render scaling charts (time vs sequence, weak and strong scaling, memory, summary checkpoint) from "
    "result files as PNG and SVG; several files overlay as series."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULT", help="result files written by `bench run`")
    parser.add_argument(
        "--out", metavar="DIR", help="folder for the charts (default: the suite's plots_dir, plots/)"
    )
    common_args.add_config(parser)


def main(args: argparse.Namespace) -> int:
    return run(args.results, out=args.out, config=args.config)


def run(
    results: Sequence[str],
    *,
    out: str | None = None,
    config: str | None = None,
    console: Console | None = None,
) -> int:
    """Write every chart the results support into `out`; returns 0 (UserError when none can be drawn)."""
    # Imported here: matplotlib takes a while to load, and only plot and report need it.
    from bench.render.plots import build_charts, sources_for

    console = console or default_console
    runs = [load_result(p) for p in results]
    if not any(c.status == "ok" for r in runs for c in r.cases):
        raise UserError(f"{', '.join(results)}: no case is ok, nothing to plot; see `bench show` for why")
    folder = Path(out) if out else load_suite(config).plots_dir
    charts, notes = build_charts(sources_for(runs, [Path(p).stem for p in results]))
    for chart in charts:
        paths = chart.save(folder)
        console.print(f"{escape(chart.title)}: {escape(', '.join(display(p) for p in paths))}")
    for note in notes:
        console.print(escape(note), style="dim")
    if not charts:
        raise UserError(
            f"{', '.join(results)}: none of the charts can be drawn ({len(notes)} skipped, see above)"
        )
    return 0
