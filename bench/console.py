"""Where the CLI prints: tables and progress on stdout, warnings and errors on stderr (rich)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

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


class CaseProgress:
    """The progress of a command that launches cases, one after another.

    On a terminal: a bar (the running case, bar, n/total, elapsed, the time left at the pace so far) that
    vanishes when done, leaving the status line each case printed. Elsewhere (a file, a CI log) rich draws
    no bar, so every status line starts with [i/N] instead.

        with CaseProgress(console, total=len(cases)) as progress:
            progress.start(case.key())
            ...
            progress.done(line)
    """

    def __init__(self, console: Console, total: int) -> None:
        self.console, self.total, self.finished = console, total, 0
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._task: TaskID = self._bar.add_task("", total=total)

    def __enter__(self) -> CaseProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def start(self, description: str) -> None:
        """The case now running (plain text, not markup)."""
        self._bar.update(self._task, description=escape(description))

    def done(self, line: str) -> None:
        """Print a finished case's status line (rich markup) and advance the bar."""
        self.finished += 1
        if not self.console.is_terminal:
            line = f"{escape(f'[{self.finished}/{self.total}]')} {line}"
        self._bar.console.print(line)
        self._bar.advance(self._task)
