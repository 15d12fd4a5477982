"""`bench list [SCENARIO ...]`: the scenarios of the suite, or the cases that scenarios expand to."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from rich.console import Console

from bench.commands import common_args
from bench.commands.session import CaseChoice
from bench.console import console as default_console
from bench.errors import UserError
from bench.launch.preflight import check_cases
from bench.render.suite_tables import cases_table, scenarios_table
from bench.render.tables import print_tables
from bench.suite.loader import no_scenarios_error, scenario_names
from bench.suite.selection import Selection

NAME = "list"
HELP = (
    "List the suite's scenarios, or the cases that scenarios expand to (validated, with a memory estimate)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_args.add_scenarios(parser, "scenario names or .yaml paths (none: list every scenario)")
    common_args.add_config(parser)
    common_args.add_backend_modules(parser)


def main(args: argparse.Namespace) -> int:
    return run(args.scenarios, sets=args.sets, filters=args.filters, config=args.config)


def _expand(choice: CaseChoice, name: str) -> Selection | UserError:
    """Scenario `name` with the --set of `choice`, expanded, or why it cannot be: one broken file does not
    hide the others."""
    try:
        (sel,) = dataclasses.replace(choice, scenarios=[name], filters=()).choose().selections
    except UserError as exc:
        return exc
    return sel


def run(
    scenarios: Sequence[str] = (),
    *,
    sets: Sequence[str] = (),
    filters: Sequence[str] = (),
    config: str | None = None,
    console: Console | None = None,
) -> int:
    """List scenarios (no names given; ConfigError when the suite has none: where it looked, and the fix)
    or the expanded, filtered cases of the named ones, each checked as a launch would (no host)."""
    console = console or default_console
    choice = CaseChoice(scenarios, sets, filters, config=config)
    if not scenarios:
        suite = choice.suite()
        missing = no_scenarios_error(suite)
        if missing is not None:
            raise missing
        console.print(
            scenarios_table(suite, [(name, _expand(choice, name)) for name in scenario_names(suite)])
        )
        return 0
    for sel in choice.choose().selections:
        check_cases(
            sel.locate,
            sel.scenario,
            sel.cases,
            platform=None,
            ranks_on_host=lambda c: c.cp,
            max_local_ranks=None,
        )
        # fitted to the width: headers wrap at spaces, cells stay whole
        print_tables([cases_table(sel, filtered=bool(filters))], console)
    return 0
