"""A run's results arranged like the reference PR's tables (section 3), independent of how they print.

One table per scenario and CP degree; one row per (global sequence length, mode, summary checkpoint, layout,
documents) with the forward time, the forward+backward time (each case's estimate with its 95% interval
across rounds, `format_time`) and the peak allocated memory. Peak
allocated is that of the forward+backward pass (training), or of the forward pass where only forward ran.
A table whose rows mix layouts or documents gets a column for each. `documents_table` sets every packed
case against the same case unpacked (the cost of packing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.console import ColumnGroup, fit_columns
from bench.errors import first_line
from bench.measure.timing import TimingSummary
from bench.results.analysis import PASS_LABELS, PASSES, PREFERRED_PASSES, describe_layer
from bench.results.statistics import format_ratio, ratio_interval
from bench.results.store import CaseResult, MemoryResult, RunResult
from bench.suite.config import PASS_TAGS, Case
from bench.suite.documents import documents_tag
from gdn_cp.distributed import DEFAULT_LAYOUT, mode_order


def mixes_checkpoint(checkpoints: Iterable[bool | None]) -> bool:
    """Whether rows mix summary checkpoint on and off (None, a mode without a summary, does not count):
    then a table gets a column for it."""
    return len({c for c in checkpoints if c is not None}) > 1


@dataclass(kw_only=True, slots=True)
class ReferenceRow:
    seq_len: int
    mode: str
    checkpoint: bool | None
    layout: str = DEFAULT_LAYOUT
    documents: str = "none"
    """The documents' tag (`none`: unpacked)."""
    results: dict[str, CaseResult] = field(default_factory=dict)
    """By pass (forward, forward_backward, prefill), those that ran."""

    @property
    def memory_pass(self) -> str | None:
        """The pass whose peak memory the row shows: the first of PREFERRED_PASSES that ran with a memory."""
        return next(
            (p for p in PREFERRED_PASSES if p in self.results and self.results[p].memory is not None), None
        )

    @property
    def memory(self) -> MemoryResult | None:
        return None if self.memory_pass is None else self.results[self.memory_pass].memory


@dataclass(kw_only=True, slots=True)
class ReferenceTable:
    scenario: str
    cp: int
    rows: list[ReferenceRow] = field(default_factory=list)

    @property
    def shows_checkpoint(self) -> bool:
        """Whether the table mixes summary checkpoint on and off (then it gets a column for it)."""
        return mixes_checkpoint(r.checkpoint for r in self.rows)

    @property
    def shows_layout(self) -> bool:
        """Whether a row is in another layout than contiguous (then the table gets a column for it)."""
        return any(r.layout != DEFAULT_LAYOUT for r in self.rows)

    @property
    def shows_documents(self) -> bool:
        """Whether a row packs documents (then the table gets a column for them)."""
        return any(r.documents != "none" for r in self.rows)

    @property
    def passes(self) -> list[str]:
        """The passes a time column is shown for: those a row ran, in PASSES order."""
        ran = {p for r in self.rows for p in r.results}
        return [p for p in PASSES if p in ran]


def reference_tables(run: RunResult) -> list[ReferenceTable]:
    """Tables of the ok cases of `run`, by scenario (in file order) and cp (ascending)."""
    tables: dict[tuple[str, int], ReferenceTable] = {}
    rows: dict[tuple, ReferenceRow] = {}
    for result in run.cases:
        if result.status != "ok":
            continue
        c = result.case
        table = tables.setdefault((c.scenario, c.cp), ReferenceTable(scenario=c.scenario, cp=c.cp))
        documents = documents_tag(c.documents)
        key = (c.scenario, c.cp, c.seq_len, c.mode, c.checkpoint, c.layout, documents)
        if key not in rows:
            rows[key] = ReferenceRow(
                seq_len=c.seq_len, mode=c.mode, checkpoint=c.checkpoint, layout=c.layout, documents=documents
            )
            table.rows.append(rows[key])
        rows[key].results[c.pass_] = result
    order = list(dict.fromkeys(c.case.scenario for c in run.cases))
    out = sorted(tables.values(), key=lambda t: (order.index(t.scenario), t.cp))
    for t in out:  # stable: layouts and documents keep their order of first appearance
        t.rows.sort(key=lambda r: (r.seq_len, mode_order(r.mode), r.checkpoint is False))
    return out


def not_measured(run: RunResult) -> list[CaseResult]:
    """Failed and skipped cases, in run order."""
    return [c for c in run.cases if c.status != "ok"]


def format_ms(summary: TimingSummary | None) -> str:
    """`12.345 ms`, with `*` when noisy (IQR/median > 10%); `-` when not measured."""
    if summary is None:
        return "-"
    return f"{summary.median_s * 1e3:.3f} ms" + (" *" if summary.noisy else "")


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


def format_time(result: CaseResult | None, *, contended_mark: bool = True) -> str:
    """A case's time as the tables show it: its estimate with the half-width of its 95% interval across
    rounds, `12.345 ms ±4.1%`, or `12.345 ms [6.102, 24.98]` (4 significant digits) when wider than WIDE;
    with one round the median over repeats (`format_ms`); `-` when not measured; CONTENDED_MARK after it
    when contended (unless `contended_mark` is False: a status line says why instead)."""
    if result is None:
        return "-"
    mark = CONTENDED_MARK if contended_mark and result.contended else ""
    est = result.estimate
    width = None if est is None else est.relative_half_width
    if est is None or width is None:
        return format_ms(result.timing) + mark
    if width > WIDE:
        assert est.low_s is not None and est.high_s is not None
        return f"{est.median_s * 1e3:.3f} ms [{est.low_s * 1e3:.4g}, {est.high_s * 1e3:.4g}]{mark}"
    return f"{est.median_s * 1e3:.3f} ms ±{100 * width:.1f}%{mark}"


def contention_summary(run: RunResult) -> str | None:
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
    return (
        f"{cases} of {measured} cases contended (every round timed while the machine was shared: not the "
        f"code's time alone); {shared} of {rounds} rounds in all (a case's estimate leaves its contended "
        "rounds out while it has others)"
    )


def incomplete_summary(run: RunResult) -> str | None:
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


def contended_cases(cases: Iterable[CaseResult]) -> tuple[int, int]:
    """(how many of the ok `cases` are contended, how many are ok)."""
    ok = [c for c in cases if c.status == "ok"]
    return sum(c.contended for c in ok), len(ok)


def mostly_contended(cases: Iterable[CaseResult]) -> bool:
    """More than half of the ok `cases` are contended: a report or chart of them says so in its title."""
    shared, ok = contended_cases(cases)
    return 2 * shared > ok


def format_mib(memory: MemoryResult | None) -> str:
    return "-" if memory is None else f"{memory.peak_mib:.1f} MiB"


def format_tokens(n: int) -> str:
    """32768 -> 32K (the reference PR's spelling), 1000 -> 1000."""
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def format_checkpoint(checkpoint: bool | None) -> str:
    return "n/a" if checkpoint is None else ("on" if checkpoint else "off")


def format_throughput(result: CaseResult) -> str:
    """ "  12.3 GFLOP/s/rank (31% of matmul)", or "" without a throughput record."""
    tp, t = result.throughput, result.timing
    if tp is None or t is None:
        return ""
    cp = result.case.cp
    achieved, fraction = tp.achieved_gflops(t.median_s, cp), tp.fraction(t.median_s, cp)
    return f"  {achieved:.1f} GFLOP/s/rank ({100 * fraction:.0f}% of matmul)"


CASE_LINE_LEGEND = (
    "status lines: IQR = interquartile range / median over repeats; ranks xN = the slowest rank's median "
    "/ the fastest's (1.00: balanced); peak = rank-max peak allocated; contended = the machine was shared "
    "while it was timed (no verdict in bench compare)"
)
"""What the labels of `case_line` mean, printed once under the run's tables (bench show's notes)."""


def case_line(result: CaseResult) -> str:
    """One rich-markup status line of a finished case: status, id, its time (`format_time`: the estimate,
    as every table shows it), IQR, peak, wall time, and whether the machine was shared."""
    case_id = escape(result.case.case_id)
    if result.status == "ok" and result.timing is not None:
        t = result.timing
        spread = f", ranks x{t.rank_spread:.2f}" if len(t.rank_medians_s) > 1 else ""
        shared = result.contention.reason if result.contention is not None else None
        contended = f"  [bold yellow]contended[/] ({escape(shared)})" if shared else ""
        time = escape(format_time(result, contended_mark=False))  # `contended` follows, with why
        return (
            f"[green]ok[/]      {case_id:<36} {time:>16}  IQR {100 * t.relative_iqr:4.1f}%{spread}  "
            f"peak {format_mib(result.memory)}{format_throughput(result)}  [dim]{result.wall_s:.1f} s[/]"
            f"{contended}"
        )
    error = first_line(result.error)
    style = "red" if result.status == "failed" else "yellow"
    return f"[{style}]{result.status:<7}[/] {case_id:<36} {escape(error)}"


@dataclass(kw_only=True, slots=True)
class TableData:
    """A table as text cells, independent of how it is printed."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    numeric: set[int] = field(default_factory=set)
    """Columns justified right."""
    notes: list[str] = field(default_factory=list)
    """Lines printed under the table."""
    verdict_column: int | None = None
    """A column of verdict cells, coloured in the terminal."""
    verdict_styles: dict[str, str] | None = None
    """The rich style of each verdict; None: pass green, anything else bold red."""


def to_rich(table: TableData, group: ColumnGroup | None = None, *, continued: bool = False) -> Table:
    """The table for the terminal: all its columns, or those of `group` at the group's widths."""
    columns = group.columns if group is not None else list(range(len(table.headers)))
    widths = group.widths if group is not None and group.widths is not None else [None] * len(columns)
    title = table.title + (" (continued)" if continued else "")
    t = Table(title=escape(title), title_justify="left")
    for i, width in zip(columns, widths, strict=True):
        t.add_column(escape(table.headers[i]), justify="right" if i in table.numeric else "left", width=width)
    for row in table.rows:
        cells = {i: escape(row[i]) for i in columns}
        if table.verdict_column in cells:
            v = row[table.verdict_column]
            if table.verdict_styles is None:
                style = "green" if v == "pass" else "bold red"
            else:
                style = table.verdict_styles.get(v, "")
            cells[table.verdict_column] = f"[{style}]{escape(v)}[/]" if style else escape(v)
        t.add_row(*(cells[i] for i in columns))
    return t


def print_tables(tables: Sequence[TableData], console: Console) -> None:
    """Each table fitted to the console's width (in column groups where it is too wide), then its notes."""
    for table in tables:
        for k, group in enumerate(fit_columns(table.headers, table.rows, console.width, table.numeric)):
            console.print(to_rich(table, group, continued=k > 0))
        for note in table.notes:
            style = "red" if note.startswith(("FAIL", "initial weights DIFFER")) else "dim"
            console.print(escape(note), style=style)  # wrapped at words to the width, as the tables are


def throughput_table(run: RunResult) -> TableData | None:
    """How close each ok case ran to the limit: model GFLOP/s per rank at its median against the measured
    matmul GFLOP/s of its ranks; None when no case has a throughput record (older files)."""
    rows = [
        [
            r.key,
            f"{r.throughput.model_flops / 1e9:.2f}",
            f"{r.throughput.achieved_gflops(r.timing.median_s, r.case.cp):.1f}",
            f"{r.throughput.matmul_gflops:.1f}"
            + (f" {r.throughput.matmul_dtype}" if r.throughput.matmul_dtype else ""),
            f"{100 * r.throughput.fraction(r.timing.median_s, r.case.cp):.0f}%",
        ]
        for r in run.cases
        if r.status == "ok" and r.throughput is not None and r.timing is not None
    ]
    if not rows:
        return None
    return TableData(
        title="throughput",
        headers=["case", "model GFLOP", "GFLOP/s/rank", "matmul GFLOP/s", "of limit"],
        rows=rows,
        numeric={1, 2, 3, 4},
        notes=[
            "model FLOPs of the pass (gdn_cp.layers.GatedDeltaNetConfig.flops; backward = 2x forward) / cp / "
            "the median; limit: the slowest rank's batched C x K @ K x V matmul (bench.measure.throughput)"
        ],
    )


def reference_table_data(table: ReferenceTable, run: RunResult) -> TableData:
    """One reference table as cells (what `bench show` prints and `bench report` renders): global seq | mode
    | [summary ckpt] | [layout] | [documents] | a time per pass that ran (forward | forward+backward |
    prefill) | peak allocated."""
    headers = ["global seq", "mode"] + (["summary ckpt"] if table.shows_checkpoint else [])
    headers += (["layout"] if table.shows_layout else []) + (["documents"] if table.shows_documents else [])
    passes = table.passes
    headers += [PASS_LABELS[p] for p in passes] + ["peak allocated"]
    rows = []
    for row in table.rows:
        cells = [format_tokens(row.seq_len), row.mode]
        if table.shows_checkpoint:
            cells.append(format_checkpoint(row.checkpoint))
        if table.shows_layout:
            cells.append(row.layout)
        if table.shows_documents:
            cells.append(row.documents)
        shown = row.memory_pass  # tagged when it is not training's (the reference PR's peak)
        tag = f" ({PASS_TAGS[shown]})" if shown not in (None, PREFERRED_PASSES[0]) else ""
        peak = format_mib(row.memory) + tag
        rows.append([*cells, *(format_time(row.results.get(p)) for p in passes), peak])
    dims = describe_layer(run.scenarios.get(table.scenario, {}))
    numeric = {0} | set(range(len(headers) - len(passes) - 1, len(headers)))
    return TableData(
        title=f"{table.scenario}: CP{table.cp} ({dims})",
        headers=headers,
        rows=rows,
        numeric=numeric,
        notes=[TIME_NOTE],
    )


def _unpacked_key(case: Case) -> tuple:
    """What a packed case shares with its unpacked twin: everything but the documents."""
    return (case.scenario, case.mode, case.checkpoint, case.cp, case.seq_len, case.layout, case.pass_)


def documents_table(run: RunResult) -> TableData | None:
    """Every ok packed case beside the same case unpacked (scenario, mode, checkpoint, cp, tokens, layout,
    pass): both times and packed / unpacked (of the estimates, with its 95% interval across rounds), the
    cost of restarting the state and the Conv1D at every document. None when no packed case has an unpacked
    twin in the run."""
    ok = [r for r in run.cases if r.status == "ok" and r.timing is not None]
    unpacked = {_unpacked_key(r.case): r for r in ok if r.case.documents is None}
    rows = []
    for r in ok:
        twin = unpacked.get(_unpacked_key(r.case))
        if r.case.documents is None or twin is None:
            continue
        assert r.timing is not None and twin.timing is not None
        c = r.case
        rows.append(
            [
                c.scenario,
                str(c.cp),
                c.mode + ("" if c.checkpoint is not False else " (no ckpt)"),
                c.layout,
                documents_tag(c.documents),
                PASS_TAGS[c.pass_],
                format_time(twin),
                format_time(r),
                format_ratio(ratio_interval(twin.estimate_medians, r.estimate_medians)),
            ]
        )
    if not rows:
        return None
    return TableData(
        title="packed documents vs the same tokens unpacked",
        headers=[
            *("scenario", "cp", "mode", "layout", "documents", "pass"),
            *("unpacked", "packed", "packed/unpacked"),
        ],
        rows=rows,
        numeric={1, 6, 7, 8},
        notes=[
            TIME_NOTE,
            "packed/unpacked: the packed case's estimate over the unpacked one's, [its 95% interval] (1.00x: "
            "packing is free)",
        ],
    )
