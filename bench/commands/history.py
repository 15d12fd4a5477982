"""`bench history PATH ... [--format html|table] [--out DIR] [--fail-on-regression]`: cases across commits.

Reads every result file under the paths (a backfill's folders, `bench run --commits`, or CI's runs on main),
groups them by machine and scenario (bench.judge.history), finds each case's change points
(bench.judge.changepoints), and writes a static site (html, the default: a new folder under results/
unless --out names one) or prints the changes found (table). `--fail-on-regression` exits 3 when the newest
commit of a history starts a step up in a case's time (a CI job on main fails on it).
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.commands import common_args
from bench.console import console as default_console
from bench.errors import UserError
from bench.judge.comparison import DEFAULT_ALPHA, DEFAULT_FACTOR
from bench.judge.history import History, change_text, load_history, regressions_at_newest
from bench.results.paths import new_folder
from bench.suite.loader import display, load_suite

NAME = "history"
HELP = "Follow cases across commits: a static site of time and memory by commit, with change points."
EXIT_REGRESSION = 3
"""--fail-on-regression: the newest commit starts a step up in some case's time."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="result files, or folders searched for them (e.g. results/history)",
    )
    parser.add_argument(
        "--format",
        dest="fmt",
        choices=("html", "table"),
        default="html",
        help="html: write the site (default); table: print the changes found",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="the site's folder, new or empty (default: a new <results_dir>/history-site-<date>-<time>/)",
    )
    parser.add_argument(
        "--fail-on-regression",
        action="store_true",
        help=f"exit {EXIT_REGRESSION} when the newest commit of a history starts a step up in a case's time",
    )
    parser.add_argument(
        "--factor",
        type=common_args.positive_number,
        default=DEFAULT_FACTOR,
        help=f"the smallest step called a change, as `bench compare` (default {DEFAULT_FACTOR})",
    )
    parser.add_argument(
        "--alpha",
        type=common_args.positive_number,
        default=DEFAULT_ALPHA,
        help=f"false-alarm rate per case and stretch searched (default {DEFAULT_ALPHA})",
    )
    common_args.add_config(parser)


def main(args: argparse.Namespace) -> int:
    return run(
        args.paths,
        fmt=args.fmt,
        out=args.out,
        fail_on_regression=args.fail_on_regression,
        factor=args.factor,
        alpha=args.alpha,
        config=args.config,
    )


def changes_table(history: History) -> Table:
    """The changes of one history, newest first: case, commit, change, direction; fits 80 columns."""
    table = Table(
        title=f"{history.scenario} on {history.machine}: {len(history.runs)} runs", title_justify="left"
    )
    table.add_column("case", overflow="fold")
    table.add_column("commit")
    table.add_column("date")
    table.add_column("change", justify="right")
    found = [(case, c) for case in history.cases for c in case.changes]
    for case, change in sorted(found, key=lambda cc: (-cc[1].index, cc[0].key)):
        run = history.runs[change.index]
        colour = "red" if change.verdict == "worse" else "green"
        table.add_row(
            escape(case.key.split("/", 1)[1]),
            run.commit.short,
            run.date[:10],
            f"[{colour}]{change_text(change, contended=case.change_contended(change))}[/]",
        )
    if not found:
        table.add_row("no change found", "", "", "")
    return table


def _out_folder(out: str | None, config: str | None) -> Path:
    if out is None:
        suite = load_suite(config)
        return new_folder(suite.results_dir / f"history-site-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty folder; give a new folder for the site")
    path.mkdir(parents=True, exist_ok=True)
    return path


def run(
    paths: Sequence[str],
    *,
    fmt: str = "html",
    out: str | None = None,
    fail_on_regression: bool = False,
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
    config: str | None = None,
    console: Console | None = None,
) -> int:
    """Build the histories of `paths` and write the site or print the changes; the exit code."""
    console = console or default_console
    if fmt not in ("html", "table"):
        raise UserError(f"--format {fmt}: use html or table")
    histories = load_history([Path(p) for p in paths], factor=factor, alpha=alpha)
    if fmt == "table":
        for h in histories:
            console.print(changes_table(h))
            shared = h.contention_summary()
            if shared is not None:
                console.print(f"[bold yellow]contended[/]: {escape(shared)}")
    else:
        # Imported here: matplotlib takes a while to load, and only the site needs it.
        from bench.render.history import write_site

        folder = _out_folder(out, config)
        written = write_site(histories, folder)
        console.print(f"history site: {escape(display(written[0]))} ({len(written) - 1} scenario pages)")
    regressions = regressions_at_newest(histories)
    for h, case, change in regressions:
        console.print(
            f"[red]regression[/] at the newest commit {h.newest.commit.short}: {escape(case.key)} "
            f"{change_text(change)}"
        )
    return EXIT_REGRESSION if fail_on_regression and regressions else 0
