"""Where the CLI prints: tables and progress on stdout, warnings and errors on stderr (rich)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# Piped output (a file, CI logs) gets a wide page instead of rich's 80 columns, so case ids are never cut.
_WIDTH = None if sys.stdout.isatty() else 160

console = Console(highlight=False, width=_WIDTH)
"""Tables, progress and results."""
err_console = Console(stderr=True, highlight=False, width=_WIDTH)
"""Warnings and errors."""


def print_error(message: str) -> None:
    """A user error: one red line."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def print_warning(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def case_progress(console: Console) -> Progress:
    """The progress bar of a command that launches cases: description, bar, n/total, elapsed; it vanishes
    when done, leaving the status line each case printed."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
