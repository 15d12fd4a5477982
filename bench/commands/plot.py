"""`bench plot RESULT ... [--out DIR] [--force]`: the scaling charts of result files, as PNG and SVG
(bench.render.charts).

Several files overlay as series (e.g. two branches), those of one machine only: runs of different machines
never share an axis (each machine gets its own charts, `-machine2`, ...) unless --force. File names are
stable (time_vs_seq.png, ...), so a README can embed them; a chart the results cannot support is skipped
with a one-line note. Without --out the charts go to a new folder, <results_dir>/plots-<date>-<time>/ (-2,
-3, ... when taken), never into an existing one: the committed charts (plots/) are written only when named,
`--out plots`.
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
from bench.results.names import resolve_result
from bench.results.outputs import check_output_folder
from bench.results.paths import new_charts_folder
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
        "--out",
        metavar="DIR",
        help="folder for the charts, written over when they exist (e.g. --out plots for the committed "
        "charts; default: a new folder <results_dir>/plots-<date>-<time>/)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="overlay runs of different machines on one axis (by default each machine gets its own charts)",
    )
    common_args.add_config(parser)


def main(args: argparse.Namespace) -> int:
    return run(args.results, out=args.out, config=args.config, force=args.force)


def run(
    results: Sequence[str],
    *,
    out: str | None = None,
    config: str | None = None,
    force: bool = False,
    console: Console | None = None,
) -> int:
    """Write every chart the results support into `out`; returns 0 (UserError when none can be drawn).
    Runs of different machines get charts of their own unless `force` overlays them."""
    # Imported here: matplotlib takes a while to load, and only plot and report need it.
    from bench.render.charts import build_charts, sources_for

    console = console or default_console
    if out is not None:
        check_output_folder(out, flag="--out", hint="give a folder for the charts (it is created if missing)")
    suite = load_suite(config) if out is None else None
    results = [resolve_result(r, config=config) for r in results]  # latest, latest~1, ...
    runs = [load_result(p) for p in results]
    if not any(c.status == "ok" for r in runs for c in r.cases):
        raise UserError(f"{', '.join(results)}: no case is ok, nothing to plot; see `bench show` for why")
    charts, notes = build_charts(sources_for(runs), force=force)
    if charts:  # a new folder only when there is something to put in it
        folder = Path(out) if suite is None else new_charts_folder(suite.results_dir)
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
