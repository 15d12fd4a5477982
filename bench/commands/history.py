"""`bench history PATH ... [--format html|table] [--out DIR] [--fail-on-regression]`: cases across commits.

Reads every result file under the paths (a backfill's folders, `bench run --commits`, or CI's runs on main;
bench.results.history, which skips the JSON files that are not result files, such as profiles' traces, with
one note), groups them by machine and scenario (bench.judge.history), finds each case's change points
(bench.judge.changepoints) within the stretches of runs that `bench compare` would compare (one rule,
bench.judge.comparison.comparability: a break names what differs, and `--force` searches across it), and
writes a static site (html, the default: a new folder under results_dir
unless --out names one) or prints the changes found (table). `--fail-on-regression` exits 3 when the newest
commit of a history starts a step up in a case's time (a CI job on main fails on it).
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.commands import common_args
from bench.console import console as default_console
from bench.console import fit_columns
from bench.errors import UserError
from bench.judge.comparison import DEFAULT_ALPHA, DEFAULT_FACTOR
from bench.judge.history import History, break_notes, build_histories, change_text, regressions_at_newest
from bench.results.history import load_runs, skipped_note
from bench.results.names import resolve_result
from bench.results.outputs import check_output_folder
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
        help="result files (or latest, latest~1, ...), or folders searched for them (e.g. runs/history)",
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
    parser.add_argument(
        "--force",
        action="store_true",
        help="look for changes across runs that are not comparable (another warmup, scenario, torch, "
        "machine), as `bench compare --force` compares them",
    )
    parser.add_argument(
        "--allow-different-outputs",
        action="store_true",
        help="look for changes across runs whose outputs differ beyond the gate's bar, as `bench compare "
        "--allow-different-outputs`",
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
        force=args.force,
        allow_different_outputs=args.allow_different_outputs,
        config=args.config,
    )


CONTENDED_MARK = "*"
"""After a change whose run before or after was timed on a shared machine (the step may be the machine's)."""


def changes_table(history: History, width: int) -> tuple[str, Table]:
    """The changes of one history, newest first (case, commit, date, change), as its title line and a table
    of `width` columns at most: cells never cut, the date left out where it would not fit (the commit names
    the run), `*` after a change next to a contended run."""
    found = sorted(
        ((case, c) for case in history.cases for c in case.changes), key=lambda cc: (-cc[1].index, cc[0].key)
    )
    rows, colours = [], []
    for case, change in found:
        run = history.runs[change.index]
        mark = CONTENDED_MARK if case.change_contended(change) else ""
        rows.append(
            [case.key.split("/", 1)[1], run.commit.short, run.date[:10], f"{change_text(change)}{mark}"]
        )
        colours.append("red" if change.verdict == "worse" else "green")
    headers = ["case", "commit", "date", "change"]
    keep = [0, 1, 2, 3]
    if len(fit_columns(headers, rows, width, numeric={3})) > 1:
        keep = [0, 1, 3]  # the date goes first: the commit names the run
    table = Table()
    for i in keep:
        table.add_column(headers[i], justify="right" if i == 3 else "left", no_wrap=True)
    for row, colour in zip(rows, colours, strict=True):
        cells = [escape(row[i]) for i in keep]
        cells[-1] = f"[{colour}]{cells[-1]}[/]"
        table.add_row(*cells)
    if not found:
        table.add_row("no change found", *([""] * (len(keep) - 1)))
    return f"{history.scenario} on {history.machine}: {len(history.runs)} runs", table


def load_history(
    paths: Sequence[Path],
    *,
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
    force: bool = False,
    allow_different_outputs: bool = False,
    note: Callable[[str], None] = lambda line: None,
) -> list[History]:
    """The histories of the result files under `paths`: loaded (bench.results.history), then judged
    (bench.judge.history); `note` gets the one line naming the files skipped as not result files."""
    loaded = load_runs(paths)
    skipped = skipped_note(loaded.skipped)
    if skipped is not None:
        note(skipped)
    return build_histories(
        loaded.runs, factor=factor, alpha=alpha, force=force, allow_different_outputs=allow_different_outputs
    )


def _out_folder(out: str | None, config: str | None) -> Path:
    if out is None:
        suite = load_suite(config)
        return new_folder(suite.results_dir / f"history-site-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    path = check_output_folder(out, flag="--out", hint="give a new folder for the site")
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
    force: bool = False,
    allow_different_outputs: bool = False,
    config: str | None = None,
    console: Console | None = None,
) -> int:
    """Build the histories of `paths` and write the site or print the changes; the exit code."""
    console = console or default_console
    if fmt not in ("html", "table"):
        raise UserError(f"--format {fmt}: use html or table")
    histories = load_history(
        [Path(resolve_result(p, config=config)) for p in paths],
        factor=factor,
        alpha=alpha,
        force=force,
        allow_different_outputs=allow_different_outputs,
        note=lambda line: console.print(f"note: {escape(line)}", style="dim", soft_wrap=True),
    )
    if fmt == "table":
        for h in histories:
            title, table = changes_table(h, console.width)
            console.print(escape(title))
            console.print(table)
            if any(case.change_contended(c) for case in h.cases for c in case.changes):
                console.print(
                    f"{CONTENDED_MARK}: the run before or after the step was contended", style="dim"
                )
            for line in break_notes(h):
                console.print(escape(line), style="yellow")
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
