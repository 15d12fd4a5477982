"""Tables as text cells (TableData), printed to the terminal fitted to its width (in column groups where a
table is too wide) and rendered by the report as markdown: the reference PR's timing tables, throughput,
and packed documents against the same tokens unpacked.

`reference_table_data` shows each case's forward, forward+backward and prefill time (`format_time`: the
estimate with its 95% interval across rounds) and its peak allocated memory. `documents_table` sets every
packed case against the same case unpacked (the cost of packing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.console import ColumnGroup, fit_columns
from bench.formats import (
    TIME_NOTE,
    format_checkpoint,
    format_mib,
    format_time,
    format_tokens,
)
from bench.judge.analysis import PASS_LABELS, PREFERRED_PASSES, describe_layer
from bench.judge.reference import ReferenceTable, scenario_order
from bench.measure.statistics import format_ratio, ratio_interval
from bench.results.store import RunResult
from bench.suite.config import PASS_TAGS, Case
from bench.suite.documents import documents_tag


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
    """How close each ok case ran to the limit: model GFLOP/s per rank at its time (CaseResult.seconds, the
    estimate) against the measured matmul GFLOP/s of its ranks, in scenario order; None when no case has a
    throughput record (older files)."""
    order = scenario_order(list(run.scenarios))
    rows = []
    for r in sorted(run.cases, key=lambda r: order(r.case)):
        seconds = r.seconds
        if r.status != "ok" or r.throughput is None or seconds is None:
            continue
        tp, cp = r.throughput, r.case.cp
        matmul = f"{tp.matmul_gflops:.1f}" + (f" {tp.matmul_dtype}" if tp.matmul_dtype else "")
        rows.append(
            [
                r.key,
                f"{tp.model_flops / 1e9:.2f}",
                f"{tp.achieved_gflops(seconds, cp):.1f}",
                matmul,
                f"{100 * tp.fraction(seconds, cp):.0f}%",
            ]
        )
    if not rows:
        return None
    return TableData(
        title="throughput",
        headers=["case", "model GFLOP", "GFLOP/s/rank", "matmul GFLOP/s", "of limit"],
        rows=rows,
        numeric={1, 2, 3, 4},
        notes=[
            "model FLOPs of the pass (gdn_cp.layers.GatedDeltaNetConfig.flops; backward = 2x forward) / cp / "
            "the case's time (its estimate); limit: the slowest rank's batched C x K @ K x V matmul "
            "(bench.measure.throughput)"
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
