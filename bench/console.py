"""Where the CLI prints: tables and progress on stdout, warnings and errors on stderr (rich)."""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from rich.cells import cell_len
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

# Piped output (a file, CI logs) gets a wide page instead of rich's 80 columns, so case ids are never cut;
# COLUMNS, when set, is the width everywhere (rich reads it when the width is None).
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160

console = Console(highlight=False, width=_WIDTH)
"""Tables, progress and results."""
err_console = Console(stderr=True, highlight=False, width=_WIDTH)
"""Warnings and errors."""


def print_error(message: str) -> None:
    """A user error: one red line."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def print_warning(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def print_path(console: Console, label: str, path: str, after: str = "") -> None:
    """`label: path after` on one line where it fits the console, else the label (and `after`) on one line
    and the path alone on the next, indented: a path is never split mid-name by a wrap (plain text)."""
    line = f"{label}: {path}" + (f" {after}" if after else "")
    if len(line) <= console.width:
        console.print(escape(line), soft_wrap=True)
        return
    console.print(escape(f"{label}" + (f" {after}" if after else "") + ":"))
    console.print(escape(f"  {path}"), soft_wrap=True)


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

    def __init__(self, console: Console, total: int, work: float | None = None) -> None:
        """`total` cases to run; `work`: their expected cost in any unit (the sum of what `done` is given),
        so that the time left follows each kind's own pace (None: every case alike)."""
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
        self._task: TaskID = self._bar.add_task("", total=total if work is None else work)

    def __enter__(self) -> CaseProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def start(self, description: str) -> None:
        """The case now running (plain text, not markup)."""
        self._bar.update(self._task, description=escape(description))

    def done(self, line: str, work: float = 1.0) -> None:
        """Print a finished case's status line (rich markup) and advance the bar by its `work`."""
        self.finished += 1
        if not self.console.is_terminal:
            line = f"{escape(f'[{self.finished}/{self.total}]')} {line}"
        self._bar.console.print(line)
        self._bar.advance(self._task, work)


COLUMN_OVERHEAD = 3
"""Characters a table column takes besides its text: a space either side and a border."""


@dataclass(frozen=True, slots=True)
class ColumnGroup:
    """Some columns of a table and the width each is drawn at (None: its natural width)."""

    columns: list[int]
    widths: list[int] | None


def _narrowest(texts: Sequence[str]) -> int:
    """The narrowest a column can be with its header wrapped at spaces and its cells whole (a cell broken
    mid-number, or its `*` pushed onto a row of its own, would read as another value)."""
    header, *cells = texts
    return max([*(cell_len(w) for w in header.split() or [""]), *(cell_len(c) for c in cells)])


def fit_columns(
    headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, numeric: Collection[int] = ()
) -> list[ColumnGroup]:
    """How to draw a table in `width` characters without cutting a cell: all columns at once where they
    fit, headers wrapped at spaces where needed; else in groups, each repeating the leading columns that
    name a row (the first, and those before the first `numeric` one after it, up to half the width)."""
    n = len(headers)
    texts = [[headers[i], *(r[i] for r in rows)] for i in range(n)]
    natural = [max(cell_len(t) for t in col) for col in texts]
    narrowest = [_narrowest(col) for col in texts]
    room = lambda cols: width - 1 - COLUMN_OVERHEAD * len(cols)  # noqa: E731 -- one rule, used thrice
    if sum(natural) <= room(range(n)):
        return [ColumnGroup(columns=list(range(n)), widths=None)]
    keys = [0]
    # row names end at the first numeric column, and never take more than half the page
    while len(keys) < n - 1 and len(keys) not in numeric and sum(narrowest[: len(keys) + 1]) <= width // 2:
        keys.append(len(keys))
    groups: list[list[int]] = []
    current = list(keys)
    for i in range(len(keys), n):
        if len(current) > len(keys) and sum(narrowest[c] for c in [*current, i]) > room([*current, i]):
            groups.append(current)
            current = list(keys)
        current.append(i)
    groups.append(current)
    return [
        ColumnGroup(columns=g, widths=_shrink([natural[c] for c in g], [narrowest[c] for c in g], room(g)))
        for g in groups
    ]


def _shrink(natural: list[int], narrowest: list[int], room: int) -> list[int] | None:
    """Widths that fit `room`, taking from the column with the most to spare first (None: they fit)."""
    if sum(natural) <= room:
        return None
    widths = list(natural)
    for _ in range(sum(natural) - room):
        spare = max(range(len(widths)), key=lambda k: widths[k] - narrowest[k])
        if widths[spare] <= narrowest[spare]:
            break  # one key column set alone wider than the page: rich crops, nothing narrower reads
        widths[spare] -= 1
    return widths
