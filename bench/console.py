"""Where the CLI prints: tables and progress on stdout, warnings and errors on stderr (rich)."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

# Piped output (a file, CI logs) gets a wide page instead of rich's 80 columns, so case ids are never cut;
# COLUMNS, when set, is the width everywhere (rich reads it when the width is None).
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160

console = Console(highlight=False, width=_WIDTH)
"""Tables, progress and results."""
err_console = Console(stderr=True, highlight=False, width=_WIDTH)
"""Warnings and errors."""


def print_error(message: str) -> None:
    """A user error: one message, red `error:` first (wrapped as `_print_message` says)."""
    _print_message(err_console, "error:", "bold red", message)


def print_warning(message: str) -> None:
    """A warning: one message, yellow `warning:` first (wrapped as `_print_message` says)."""
    _print_message(err_console, "warning:", "yellow", message)


def wraps(console: Console) -> bool:
    """Whether a one-line message wraps to `console`'s width: on a terminal, or where COLUMNS says the width
    (`COLUMNS=80 bench ...`); a log without COLUMNS keeps each message on one line, to be found whole."""
    return console.is_terminal or bool(os.environ.get("COLUMNS"))


def _print_message(console: Console, label: str, style: str, message: str) -> None:
    """`label message` at word boundaries within the width, continued lines indented by two (a word longer
    than a line, such as a long path, is broken there: nothing runs past the width), or on one line where
    the console does not wrap (`wraps`). The one-message contract is about content, not a terminal line."""
    if not wraps(console):
        console.print(f"[{style}]{label}[/] {escape(message)}", soft_wrap=True)
        return
    lines = textwrap.wrap(
        f"{label} {message}", console.width, subsequent_indent="  ", break_on_hyphens=False
    ) or [label]
    console.print(f"[{style}]{label}[/]{escape(lines[0][len(label) :])}", soft_wrap=True)
    for line in lines[1:]:
        console.print(escape(line), soft_wrap=True)


def print_path(console: Console, label: str, path: str, after: str = "") -> None:
    """`label: path after` on one line where it fits the console, else the label (and `after`) on one line
    and the path alone on the next, indented: a path is never split mid-name by a wrap (plain text)."""
    line = f"{label}: {path}" + (f" {after}" if after else "")
    if len(line) <= console.width:
        console.print(escape(line), soft_wrap=True)
        return
    console.print(escape(f"{label}" + (f" {after}" if after else "") + ":"))
    console.print(escape(f"  {path}"), soft_wrap=True)


def _seconds_left(task: Task) -> float | None:
    """The work left at the pace of the work done (CaseProgress keeps `pace`, seconds per unit of work, and
    `at`, when it was last refined), less the time since: None before the first unit finished."""
    pace, at = task.fields.get("pace"), task.fields.get("at")
    if pace is None or at is None or task.total is None:
        return None
    return max(0.0, pace * (task.total - task.completed) - (time.monotonic() - at))


class _TimeLeft(ProgressColumn):
    """`eta 2:05`: the time left at the pace so far, from the first finished unit on (`eta -` before it),
    counting down between units. rich's own column needs two updates within its 30 s window, so a run whose
    case-rounds take longer showed none for minutes."""

    def render(self, task: Task) -> Text:
        left = _seconds_left(task)
        if left is None:
            return Text("eta -", style="progress.remaining")
        minutes, seconds = divmod(round(left), 60)
        hours, minutes = divmod(minutes, 60)
        shown = f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
        return Text(f"eta {shown}", style="progress.remaining")


class CaseProgress:
    """The progress of a command that launches cases (or case-rounds), one after another.

    On a terminal: a bar (the running case, bar, n/total in `unit`, elapsed, the time left at the pace so
    far) that vanishes when done, leaving the status line each case printed. The bar fills by the work done
    (`work`: each kind of case at its own cost) and its count is of units ("68/190 case-rounds"); the time
    left is the elapsed time per unit of work done so far times the work left, from the first finished unit
    on. Elsewhere (a file, a CI log) rich draws no bar, so every status line starts with [i/N] instead.

        with CaseProgress(console, total=len(cases)) as progress:
            progress.start(case.key())
            ...
            progress.done(line)
    """

    def __init__(self, console: Console, total: int, work: float | None = None, *, unit: str = "") -> None:
        """`total` units to run (cases, or case-rounds: `unit` names them beside the count); `work`: their
        expected cost in any unit (the sum of what `done` is given), so that the time left follows each
        kind's own pace (None: every unit alike)."""
        self.console, self.total, self.finished = console, total, 0
        self._unit = f" {unit}" if unit else ""
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            TextColumn("{task.fields[count]}"),
            TimeElapsedColumn(),
            _TimeLeft(),
            console=console,
            transient=True,
        )
        self._started = time.monotonic()
        self._task: TaskID = self._bar.add_task(
            "", total=total if work is None else work, count=self._count(), pace=None, at=None
        )

    def _count(self) -> str:
        return f"{self.finished}/{self.total}{self._unit}"

    def __enter__(self) -> CaseProgress:
        self._started = time.monotonic()
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def start(self, description: str) -> None:
        """The case now running (plain text, not markup)."""
        self._bar.update(self._task, description=escape(description))

    def done(self, line: str, work: float = 1.0) -> None:
        """Print a finished unit's status line (rich markup) and advance the bar by its `work`; the pace
        (seconds per unit of work, start-up included) is refined with every unit."""
        self.finished += 1
        if not self.console.is_terminal:
            line = f"{escape(f'[{self.finished}/{self.total}]')} {line}"
        self._bar.console.print(line)
        self._bar.advance(self._task, work)
        now = time.monotonic()
        completed = self._bar.tasks[0].completed
        pace = (now - self._started) / completed if completed > 0 else None
        self._bar.update(self._task, count=self._count(), pace=pace, at=now)

    def seconds_left(self) -> float | None:
        """The time left as the bar shows it (None before the first unit finished)."""
        return _seconds_left(self._bar.tasks[0])


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
    name a row (the first, those before the first `numeric` one after it, and numeric ones too until the
    rows are told apart, up to half the width)."""
    n = len(headers)
    texts = [[headers[i], *(r[i] for r in rows)] for i in range(n)]
    natural = [max(cell_len(t) for t in col) for col in texts]
    narrowest = [_narrowest(col) for col in texts]
    room = lambda cols: width - 1 - COLUMN_OVERHEAD * len(cols)  # noqa: E731 -- one rule, used thrice
    if sum(natural) <= room(range(n)):
        return [ColumnGroup(columns=list(range(n)), widths=None)]
    keys = [0]
    # row names: the leading columns up to the first numeric one, and as many more as it takes to tell the
    # rows apart (T and cp of a table by sequence length and CP degree); never more than half the page
    while (
        len(keys) < n - 1
        and (len(keys) not in numeric or not _unique(rows, len(keys)))
        and sum(narrowest[: len(keys) + 1]) <= width // 2
    ):
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


def _unique(rows: Sequence[Sequence[str]], leading: int) -> bool:
    """Whether the first `leading` cells name every row apart."""
    names = [tuple(r[:leading]) for r in rows]
    return len(set(names)) == len(names)


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
