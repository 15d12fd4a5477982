"""A run's results arranged like the seed's tables (reference PR, section 3), independent of how they print.

One table per scenario and CP degree; one row per (global sequence length, mode, summary checkpoint) with
the forward median, the forward+backward median and the peak allocated memory. Peak allocated is that of
the forward+backward pass (training), or of the forward pass where only forward ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

from rich.markup import escape

from bench.config import Mode
from bench.store import CaseResult, MemoryResult, RunResult
from bench.timing import TimingSummary

MODE_ORDER = {m: i for i, m in enumerate(get_args(Mode))}


@dataclass(kw_only=True, slots=True)
class SeedRow:
    seq_len: int
    mode: str
    checkpoint: bool | None
    forward: TimingSummary | None = None
    forward_backward: TimingSummary | None = None
    memory: MemoryResult | None = None
    """Of forward_backward when it ran, else of forward."""
    memory_pass: str | None = None


@dataclass(kw_only=True, slots=True)
class SeedTable:
    scenario: str
    cp: int
    rows: list[SeedRow] = field(default_factory=list)

    @property
    def shows_checkpoint(self) -> bool:
        """Whether the table mixes summary checkpoint on and off (then it gets a column for it)."""
        return len({r.checkpoint for r in self.rows if r.checkpoint is not None}) > 1


def seed_tables(run: RunResult) -> list[SeedTable]:
    """Tables of the ok cases of `run`, by scenario (in file order) and cp (ascending)."""
    tables: dict[tuple[str, int], SeedTable] = {}
    rows: dict[tuple, SeedRow] = {}
    for result in run.cases:
        if result.status != "ok":
            continue
        c = result.case
        table = tables.setdefault((c.scenario, c.cp), SeedTable(scenario=c.scenario, cp=c.cp))
        key = (c.scenario, c.cp, c.seq_len, c.mode, c.checkpoint)
        if key not in rows:
            rows[key] = SeedRow(seq_len=c.seq_len, mode=c.mode, checkpoint=c.checkpoint)
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
        t.rows.sort(key=lambda r: (r.seq_len, MODE_ORDER.get(r.mode, 99), r.checkpoint is False))
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
    """32768 -> 32K (the seed's spelling), 1000 -> 1000."""
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def format_checkpoint(checkpoint: bool | None) -> str:
    return "n/a" if checkpoint is None else ("on" if checkpoint else "off")


def case_line(result: CaseResult) -> str:
    """One rich-markup status line of a finished case: status, id, median, IQR, peak, wall time."""
    case_id = escape(result.case.case_id)
    if result.status == "ok" and result.timing is not None:
        t = result.timing
        spread = f", ranks x{t.rank_spread:.2f}" if len(t.rank_medians_s) > 1 else ""
        return (
            f"[green]ok[/]      {case_id:<36} {format_ms(t):>14}  IQR {100 * t.relative_iqr:4.1f}%{spread}  "
            f"peak {format_mib(result.memory)}  [dim]{result.wall_s:.1f} s[/]"
        )
    first_line = (result.error or "").strip().splitlines()[0] if result.error else ""
    style = "red" if result.status == "failed" else "yellow"
    return f"[{style}]{result.status:<7}[/] {case_id:<36} {escape(first_line)}"
