"""The one way every view prints a case, on the ground floor so that every floor speaks it (pyperf keeps its
`_formatter.py` apart from its commands the same way): its time (the estimate with its interval), memory,
tokens, the flags a reader must see beside a figure (contended, incomplete), and a finished case's status
line. bench show, compare, report, gate, plot, history and export, and launch's status lines, take these from
here, so no view can print a case another way.

This floor imports neither bench.measure nor bench.results: what a case gives is read through the small
Protocols below, each standing for the record named in its docstring (tests/bench/test_formats.py holds
them to it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Sized
from typing import Protocol, runtime_checkable

from rich.markup import escape
from rich.text import Text

from bench.errors import first_line


@runtime_checkable
class Interval(Protocol):
    """A case's time across rounds with its 95% interval (bench.measure.statistics.Estimate), seconds."""

    @property
    def median_s(self) -> float: ...
    @property
    def low_s(self) -> float | None: ...
    @property
    def high_s(self) -> float | None: ...
    @property
    def rounds(self) -> int: ...
    @property
    def relative_half_width(self) -> float | None: ...


@runtime_checkable
class Repeats(Protocol):
    """Rank-max statistics over a case's repeats (bench.measure.timing.TimingSummary)."""

    @property
    def median_s(self) -> float: ...
    @property
    def noisy(self) -> bool: ...
    @property
    def relative_iqr(self) -> float: ...
    @property
    def rank_spread(self) -> float: ...
    @property
    def rank_medians_s(self) -> Sequence[float]: ...


@runtime_checkable
class PlannedCase(Protocol):
    """A case as configured (bench.suite.config.Case): its id, ranks and the rounds it was to run."""

    @property
    def case_id(self) -> str: ...
    @property
    def cp(self) -> int: ...
    @property
    def rounds(self) -> int: ...


@runtime_checkable
class PeakMemory(Protocol):
    """A case's peak allocated memory (bench.results.store.MemoryResult)."""

    @property
    def peak_mib(self) -> float: ...


@runtime_checkable
class Throughput(Protocol):
    """Model FLOPs against the measured matmul limit (bench.results.store.ThroughputResult)."""

    def achieved_gflops(self, median_s: float, cp: int) -> float: ...
    def fraction(self, median_s: float, cp: int) -> float: ...


@runtime_checkable
class Sharing(Protocol):
    """How shared the machine was while a case was timed (bench.measure.contention.Contention)."""

    @property
    def reason(self) -> str | None: ...


@runtime_checkable
class MeasuredCase(Protocol):
    """The outcome of one case over its rounds (bench.results.store.CaseResult)."""

    @property
    def case(self) -> PlannedCase: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def rounds(self) -> Sized: ...
    @property
    def estimate(self) -> Interval | None: ...
    @property
    def timing(self) -> Repeats | None: ...
    @property
    def contended(self) -> bool: ...
    @property
    def contended_rounds(self) -> int: ...
    @property
    def memory(self) -> PeakMemory | None: ...
    @property
    def throughput(self) -> Throughput | None: ...
    @property
    def contention(self) -> Sharing | None: ...
    @property
    def seconds(self) -> float | None: ...
    @property
    def wall_s(self) -> float: ...


@runtime_checkable
class MeasuredRun(Protocol):
    """One result file's cases (bench.results.store.RunResult)."""

    @property
    def cases(self) -> Sequence[MeasuredCase]: ...


def format_seconds(seconds: float) -> str:
    """One amount of time as every view prints it: `12.345 ms` below a second, `1.234 s` from one on."""
    return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1e3:.3f} ms"


def _in_unit(seconds: float, centre_s: float) -> str:
    """An interval's end in the unit of its centre, 4 significant digits (no exponent)."""
    value = seconds if centre_s >= 1 else seconds * 1e3
    return f"{value:.0f}" if value >= 1e4 else f"{value:.4g}"


def format_ms(summary: Repeats | None) -> str:
    """One round's median over repeats (`format_seconds`), with `*` when noisy (IQR/median > 10%); `-` when
    not measured."""
    if summary is None:
        return "-"
    return format_seconds(summary.median_s) + (" *" if summary.noisy else "")


TIME_NOTE = (
    "times: the estimate (geometric mean of the round medians) +- the half-width of its 95% interval across "
    "rounds ([low, high] when wider than +-50%); one round: the median over repeats, * when noisy; "
    "(contended): every round timed while the machine was shared"
)
"""What `format_time`'s cells mean, printed under the tables that use it."""


WIDE = 0.5
"""An interval wider than +-50% is printed as its ends, [low, high]: a percentage that large reads as noise
about a value it no longer locates."""
CONTENDED_MARK = " (contended)"
"""After the time of a case every round of which was timed on a shared machine: never presented as clean."""


def format_estimate(est: Interval | None, one_round: Repeats | None = None) -> str:
    """An estimate with the half-width of its 95% interval across rounds, `12.345 ms ±4.1%`, or its ends
    when wider than WIDE, `12.345 ms [6.102, 24.98]`; without an interval (one round) `one_round`'s median
    (`format_ms`) when given, else `12.345 ms (1 round)`; `-` when there is none."""
    width = None if est is None else est.relative_half_width
    if est is None or width is None:
        if one_round is not None or est is None:
            return format_ms(one_round)
        return f"{format_seconds(est.median_s)} ({est.rounds} round{'s' * (est.rounds != 1)})"
    if width > WIDE:
        assert est.low_s is not None and est.high_s is not None
        ends = f"[{_in_unit(est.low_s, est.median_s)}, {_in_unit(est.high_s, est.median_s)}]"
        return f"{format_seconds(est.median_s)} {ends}"
    return f"{format_seconds(est.median_s)} ±{100 * width:.1f}%"


def format_time(result: MeasuredCase | None, *, contended_mark: bool = True) -> str:
    """A case's time as every view shows it (`format_estimate` of its estimate, the median over repeats
    with one round); `-` when not measured; CONTENDED_MARK after it when contended (unless `contended_mark`
    is False: a status line says why instead)."""
    if result is None:
        return "-"
    mark = CONTENDED_MARK if contended_mark and result.contended else ""
    return format_estimate(result.estimate, result.timing) + mark


def contention_summary(run: MeasuredRun) -> str | None:
    """How much of the run was timed on a shared machine, in one line for every output that presents it
    (bench show, bench run's summary, the report's banner), or None when no round was: `3 of 38 cases
    contended (every round timed while the machine was shared: not the code's time alone); 12 of 190 rounds
    in all`."""
    ok = [c for c in run.cases if c.status == "ok"]
    rounds = sum(len(c.rounds) for c in ok)
    shared = sum(c.contended_rounds for c in ok)
    if not shared:
        return None
    cases, measured = contended_cases(ok)
    if not cases:  # some rounds shared, every case has clean ones: no time shown is the other work's
        return (
            f"{shared} of {rounds} rounds were timed while the machine was shared; no case was in every "
            "round, and each estimate leaves those rounds out"
        )
    return (
        f"{cases} of {measured} cases contended (every round timed while the machine was shared: not the "
        f"code's time alone); {shared} of {rounds} rounds in all (a case's estimate leaves its contended "
        "rounds out while it has others)"
    )


def contention_label(run: MeasuredRun) -> str:
    """The word before `contention_summary` in every view: "contended" when some case was in every round,
    else "shared rounds" (a few rounds, left out of the estimates)."""
    return "contended" if contended_cases(run.cases)[0] else "shared rounds"


def incomplete_summary(run: MeasuredRun) -> str | None:
    """One line when some measured case has fewer rounds than it was to run (a run stopped early, or by
    --stop-after-round), for every output that presents the run, or None: `2 of 8 cases incomplete: 4 of 16
    rounds measured; their intervals are wider than planned (bench run --resume FILE continues the run)`."""
    ok = [c for c in run.cases if c.status == "ok"]
    short = [c for c in ok if len(c.rounds) < c.case.rounds]
    if not short:
        return None
    done = sum(len(c.rounds) for c in ok)
    planned = sum(max(c.case.rounds, len(c.rounds)) for c in ok)
    return (
        f"{len(short)} of {len(ok)} cases incomplete: {done} of {planned} rounds measured; their intervals "
        "are wider than planned (bench run --resume FILE continues the run)"
    )


def contended_cases(cases: Iterable[MeasuredCase]) -> tuple[int, int]:
    """(how many of the ok `cases` are contended, how many are ok)."""
    ok = [c for c in cases if c.status == "ok"]
    return sum(c.contended for c in ok), len(ok)


def mostly_contended(cases: Iterable[MeasuredCase]) -> bool:
    """More than half of the ok `cases` are contended: a report or chart of them says so in its title."""
    shared, ok = contended_cases(cases)
    return 2 * shared > ok


def format_mib(memory: PeakMemory | None) -> str:
    return "-" if memory is None else f"{memory.peak_mib:.1f} MiB"


def format_tokens(n: int) -> str:
    """32768 -> 32K (the reference PR's spelling), 1000 -> 1000."""
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def format_checkpoint(checkpoint: bool | None) -> str:
    return "n/a" if checkpoint is None else ("on" if checkpoint else "off")


def format_throughput(result: MeasuredCase) -> str:
    """`12.3 GFLOP/s/rank (31% of matmul)` at the case's time (CaseResult.seconds), or "" without a
    throughput record."""
    tp, seconds = result.throughput, result.seconds
    if tp is None or seconds is None:
        return ""
    cp = result.case.cp
    achieved, fraction = tp.achieved_gflops(seconds, cp), tp.fraction(seconds, cp)
    return f"{achieved:.1f} GFLOP/s/rank ({100 * fraction:.0f}% of matmul)"


CASE_LINE_LEGEND = (
    "status lines: IQR = interquartile range / median over repeats; ranks xN = the slowest rank's median "
    "/ the fastest's (1.00: balanced); peak = rank-max peak allocated; contended = the machine was shared "
    "while it was timed (no verdict in bench compare)"
)
"""What the labels of `case_line` mean, printed once under the run's tables (bench show's notes)."""


STATUS_INDENT = 8
"""Where a status line's continuation lines start (under the case id)."""


def fit_parts(parts: Sequence[str], width: int | None, *, indent: int = STATUS_INDENT) -> str:
    """Rich-markup parts joined by two spaces on one line, or, past `width` columns, on as many lines as
    they need, each continuation indented: a part is never split (None: one line, however long)."""
    lines: list[str] = []
    for part in parts:
        if lines and width is not None and _cells(lines[-1]) + 2 + _cells(part) > width:
            lines.append(" " * indent + part)
        elif lines:
            lines[-1] += "  " + part
        else:
            lines.append(part)
    return "\n".join(lines)


def _cells(markup: str) -> int:
    """The terminal columns a rich-markup string takes."""
    return Text.from_markup(markup).cell_len


def case_line(
    result: MeasuredCase, width: int | None = None, prefix: str = "", extra: Sequence[str] = ()
) -> str:
    """A finished case's status in rich markup: `prefix` (its round), status, id, its time (`format_time`:
    the estimate, as every table shows it), IQR, rank spread, peak, throughput, wall time and whether the
    machine was shared, then `extra` parts; fitted to `width` columns (`fit_parts`), never a token split."""
    case_id = escape(result.case.case_id)
    if result.status == "ok" and result.timing is not None:
        t = result.timing
        time = escape(format_time(result, contended_mark=False))  # `contended` follows, with why
        parts = [f"{prefix}[green]ok[/] {case_id}", time, f"IQR {100 * t.relative_iqr:.1f}%"]
        parts += [f"ranks x{t.rank_spread:.2f}"] if len(t.rank_medians_s) > 1 else []
        parts += [f"peak {format_mib(result.memory)}"]
        throughput = format_throughput(result)
        parts += [escape(throughput)] if throughput else []
        parts += [f"[dim]{result.wall_s:.1f} s[/]"]
        shared = result.contention.reason if result.contention is not None else None
        parts += [f"[bold yellow]contended[/] ({escape(shared)})"] if shared else []
        return fit_parts([*parts, *extra], width)
    style = "red" if result.status == "failed" else "yellow"
    return fit_parts(
        [f"{prefix}[{style}]{result.status}[/] {case_id}", escape(first_line(result.error))], width
    )
