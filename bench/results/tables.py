"""A run's results arranged like the reference PR's tables (section 3), independent of how they print.

One table per scenario and CP degree; one row per (global sequence length, mode, summary checkpoint) with
the forward median, the forward+backward median and the peak allocated memory. Peak allocated is that of
the forward+backward pass (training), or of the forward pass where only forward ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.errors import first_line
from bench.measure.timing import TimingSummary
from bench.results.analysis import describe_layer
from bench.results.store import CaseResult, MemoryResult, RunResult
from gdn_cp.distributed import mode_order


def mixes_checkpoint(checkpoints: Iterable[bool | None]) -> bool:
    """Whether rows mix summary checkpoint on and off (None, a mode without a summary, does not count):
    then a table gets a column for it."""
    return len({c for c in checkpoints if c is not None}) > 1


@dataclass(kw_only=True, slots=True)
class ReferenceRow:
    seq_len: int
    mode: str
    checkpoint: bool | None
    forward: TimingSummary | None = None
    forward_backward: TimingSummary | None = None
    memory: MemoryResult | None = None
    """Of forward_backward when it ran, else of forward."""
    memory_pass: str | None = None


@dataclass(kw_only=True, slots=True)
class ReferenceTable:
    scenario: str
    cp: int
    rows: list[ReferenceRow] = field(default_factory=list)

    @property
    def shows_checkpoint(self) -> bool:
        """Whether the table mixes summary checkpoint on and off (then it gets a column for it)."""
        return mixes_checkpoint(r.checkpoint for r in self.rows)


def reference_tables(run: RunResult) -> list[ReferenceTable]:
    """Tables of the ok cases of `run`, by scenario (in file order) and cp (ascending)."""
    tables: dict[tuple[str, int], ReferenceTable] = {}
    rows: dict[tuple, ReferenceRow] = {}
    for result in run.cases:
        if result.status != "ok":
            continue
        c = result.case
        table = tables.setdefault((c.scenario, c.cp), ReferenceTable(scenario=c.scenario, cp=c.cp))
        key = (c.scenario, c.cp, c.seq_len, c.mode, c.checkpoint)
        if key not in rows:
            rows[key] = ReferenceRow(seq_len=c.seq_len, mode=c.mode, checkpoint=c.checkpoint)
            table.rows.append(rows[key])
        row = rows[key]
        if c.pass_ == "forward":
            row.forward = result.timing
        else:
            row.forward_backward = result.timing
        if row.memory_pass != "forward_backward":
            row.memory, row.memory_pass = result.memory, c.pass_
    order = list(dict.fromkeys(c.case.scenario for c in run.cases))
    out = sorted(tables.values(), key=lambda t: (order.index(t.scenario), t.cp))
    for t in out:
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


def case_line(result: CaseResult) -> str:
    """One rich-markup status line of a finished case: status, id, median, IQR, peak, wall time."""
    case_id = escape(result.case.case_id)
    if result.status == "ok" and result.timing is not None:
        t = result.timing
        spread = f", ranks x{t.rank_spread:.2f}" if len(t.rank_medians_s) > 1 else ""
        return (
            f"[green]ok[/]      {case_id:<36} {format_ms(t):>14}  IQR {100 * t.relative_iqr:4.1f}%{spread}  "
            f"peak {format_mib(result.memory)}{format_throughput(result)}  [dim]{result.wall_s:.1f} s[/]"
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
    """A column of pass/FAIL cells, coloured in the terminal."""


def to_rich(table: TableData) -> Table:
    t = Table(title=escape(table.title), title_justify="left")
    for i, header in enumerate(table.headers):
        t.add_column(escape(header), justify="right" if i in table.numeric else "left")
    for row in table.rows:
        cells = [escape(c) for c in row]
        if table.verdict_column is not None:
            v = row[table.verdict_column]
            cells[table.verdict_column] = f"[green]{v}[/]" if v == "pass" else f"[bold red]{v}[/]"
        t.add_row(*cells)
    return t


def print_tables(tables: Sequence[TableData], console: Console) -> None:
    for table in tables:
        console.print(to_rich(table))
        for note in table.notes:
            style = "red" if note.startswith(("FAIL", "initial weights DIFFER")) else "dim"
            console.print(escape(note), style=style, soft_wrap=True)


def throughput_table(run: RunResult) -> TableData | None:
    """How close each ok case ran to the limit: model GFLOP/s per rank at its median against the measured
    matmul GFLOP/s of its ranks; None when no case has a throughput record (older files)."""
    rows = [
        [
            r.key,
            f"{r.throughput.model_flops / 1e9:.2f}",
            f"{r.throughput.achieved_gflops(r.timing.median_s, r.case.cp):.1f}",
            f"{r.throughput.matmul_gflops:.1f}",
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
    | [summary ckpt] | forward median | forward+backward median | peak allocated."""
    headers = ["global seq", "mode"] + (["summary ckpt"] if table.shows_checkpoint else [])
    headers += ["forward median", "forward+backward median", "peak allocated"]
    rows = []
    for row in table.rows:
        cells = [format_tokens(row.seq_len), row.mode]
        if table.shows_checkpoint:
            cells.append(format_checkpoint(row.checkpoint))
        peak = format_mib(row.memory) + (" (fwd)" if row.memory_pass == "forward" else "")
        rows.append([*cells, format_ms(row.forward), format_ms(row.forward_backward), peak])
    dims = describe_layer(run.scenarios.get(table.scenario, {}))
    numeric = {0} | set(range(len(headers) - 3, len(headers)))
    return TableData(
        title=f"{table.scenario}: CP{table.cp} ({dims})", headers=headers, rows=rows, numeric=numeric
    )
