"""`bench init [FOLDER]`: write the packaged defaults, a bench.yaml and a scenarios/ folder, into a folder
(default: the current one), to edit and run from there. Nothing is ever written over an existing file."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from bench.console import console as default_console
from bench.errors import UserError
from bench.results.paths import write_new
from bench.suite.loader import PACKAGED_SCENARIOS, PACKAGED_SUITE, SUITE_FILE, display

NAME = "init"
HELP = "Write a bench.yaml and a scenarios/ folder with the packaged defaults into a folder (default: here)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "folder", nargs="?", default=".", metavar="FOLDER", help="where to write (default: .)"
    )


def main(args: argparse.Namespace) -> int:
    return run(args.folder)


def run(folder: str = ".", *, console: Console | None = None) -> int:
    """Copy the packaged bench.yaml and scenarios into `folder`; UserError when either is there already."""
    console = console or default_console
    root = Path(folder)
    suite, scenarios = root / SUITE_FILE, root / "scenarios"
    taken = [p for p in (suite, scenarios) if p.exists()]
    if taken:
        names = " and ".join(display(p) for p in taken)
        raise UserError(
            f"{names}: already there, and `bench init` never overwrites; use them as they are, or init "
            "another folder (`bench init FOLDER`)"
        )
    sources = sorted(PACKAGED_SCENARIOS.glob("*.yaml"))
    if not PACKAGED_SUITE.is_file() or not sources:
        raise UserError(
            f"{display(PACKAGED_SUITE.parent)}: the packaged defaults are missing; reinstall bench "
            "(pip install -e . in its checkout)"
        )
    scenarios.mkdir(parents=True)
    write_new(suite, PACKAGED_SUITE.read_text(encoding="utf-8"))
    for source in sources:
        write_new(scenarios / source.name, source.read_text(encoding="utf-8"))
    console.print(
        f"wrote {escape(display(suite))} and {len(sources)} scenarios in {escape(display(scenarios))}; "
        "`bench list` shows them"
    )
    return 0
