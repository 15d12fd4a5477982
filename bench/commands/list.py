"""`bench list [SCENARIO ...]`: the scenarios of the suite, or the cases that scenarios expand to."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.commands import common_args
from bench.console import console as default_console
from bench.launch.estimate import estimate_peak_bytes
from bench.launch.preflight import check_cases
from bench.render.formats import format_checkpoint, format_tokens
from bench.render.tables import TableData, print_tables
from bench.suite.filters import parse_filters
from bench.suite.loader import (
    ConfigError,
    Suite,
    display,
    load_suite,
    no_scenarios_error,
    parse_overrides,
    scenario_names,
)
from bench.suite.selection import select

NAME = "list"
HELP = (
    "List the suite's scenarios, or the cases that scenarios expand to (validated, with a memory estimate)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_args.add_scenarios(parser, "scenario names or .yaml paths (none: list every scenario)")
    common_args.add_config(parser)


def main(args: argparse.Namespace) -> int:
    return run(args.scenarios, sets=args.sets, filters=args.filters, config=args.config)


def _list_scenarios(suite: Suite, console: Console) -> None:
    """The suite's scenarios with their case counts; ConfigError when it has none (where it looked, and the
    fix)."""
    missing = no_scenarios_error(suite)
    if missing is not None:
        raise missing
    t = Table(title=f"scenarios ({escape(display(suite.scenarios_dir))})", title_justify="left")
    t.add_column("name")
    t.add_column("cases", justify="right")
    t.add_column("device")
    t.add_column("description", overflow="fold")
    for name in scenario_names(suite):
        default = " (default)" if name == suite.config.default_scenario else ""
        try:
            (sel,) = select(suite, [name], [], parse_filters(None))
        except ConfigError as exc:  # one broken file should not hide the others
            t.add_row(escape(name + default), "-", "-", f"[red]{escape(str(exc))}[/]")
            continue
        device = sel.scenario.device or f"{suite.config.device} (suite)"
        t.add_row(escape(name + default), str(len(sel.cases)), device, escape(sel.scenario.description))
    console.print(t)


def run(
    scenarios: Sequence[str] = (),
    *,
    sets: Sequence[str] = (),
    filters: Sequence[str] = (),
    config: str | None = None,
    console: Console | None = None,
) -> int:
    """List scenarios (no names given) or the expanded, filtered cases of the named ones."""
    console = console or default_console
    overrides = parse_overrides(sets)
    suite = load_suite(config, overrides)
    if not scenarios:
        _list_scenarios(suite, console)
        return 0
    for sel in select(suite, scenarios, overrides, parse_filters(filters)):
        check_cases(
            sel.locate,
            sel.scenario,
            sel.cases,
            platform=None,
            ranks_on_host=lambda c: c.cp,
            max_local_ranks=None,
        )
        s = sel.scenario
        title = (
            f"{s.name}: {len(sel.cases)} of {sel.total} cases" if filters else f"{s.name}: {sel.total} cases"
        )
        rows = [
            [
                c.case_id,
                format_checkpoint(c.checkpoint),
                str(c.cp),
                format_tokens(c.seq_len),
                format_tokens(c.local_seq_len),
                f"{estimate_peak_bytes(c) / 2**20:.0f} MiB",
            ]
            for c in sel.cases
        ]
        headers = ["case", "summary ckpt", "cp", "global seq", "per rank", "est. peak/rank"]
        table = TableData(
            title=title, headers=headers, rows=rows, numeric={2, 3, 4, 5}, notes=[s.description]
        )
        print_tables([table], console)  # fitted to the width: headers wrap at spaces, cells stay whole
    return 0
