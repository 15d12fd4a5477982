"""The report's efficiency tables of one scenario: the summary-checkpoint and overlap ablations (what each
costs in time and saves in memory) and the scaling efficiency (strong: speedup t(cp=1)/t(cp) at a fixed
global sequence; weak: t(cp=1)/t(cp) at a fixed length per rank), each ratio with its 95% interval across
rounds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.formats import TIME_NOTE, format_mib, format_time, format_tokens
from bench.judge import analysis
from bench.judge.analysis import PASS_LABELS, AblationRow, ScalingPoint
from bench.measure.statistics import RatioInterval, format_ratio
from bench.render.document import Paragraph, Table
from bench.render.report_run import ReportRun
from bench.results.store import RunResult


def _pct(value: float) -> str:
    return f"{value:+.1f}%"


def _cost(a: AblationRow) -> str:
    """The time cost, with its interval across rounds where there is one; "within noise" when it holds 0."""
    interval = a.time_cost_interval_pct
    if interval is None:
        return _pct(a.time_cost_pct)
    text = f"{_pct(a.time_cost_pct)} [{interval[0]:+.1f}, {interval[1]:+.1f}]"
    return text + (" within noise" if a.within_noise else "")


def _ablation_table(rows: Sequence[AblationRow], title: str) -> Table:
    switch = rows[0].switch
    table_rows = []
    for a in rows:
        where = [str(a.cp), format_tokens(a.seq_len)]
        saved = a.memory_saved_mib
        table_rows.append(
            [*where, a.mode, switch.off_label, format_time(a.off), format_mib(a.off.memory), "", ""]
        )
        table_rows.append(
            [
                *where,
                a.mode,
                switch.on_label,
                format_time(a.on),
                format_mib(a.on.memory),
                _cost(a),
                "-" if saved is None else f"{-saved:+.1f} MiB",
            ]
        )
    passes = sorted({a.pass_ for a in rows}, key=analysis.PASSES.index)
    timed = " / ".join(PASS_LABELS[p] for p in passes)
    return Table(
        title=title,
        columns=["cp", "global seq", "mode", "implementation", timed, "peak allocated", "time", "memory"],
        rows=table_rows,
        align=["right", "right", "left", "left", "right", "right", "right", "right"],
    )


ABLATION_NOTES = {
    analysis.CHECKPOINT.field: "graph kept: the (S, M) summary's autograd graph is kept from forward to "
    "backward (checkpoint off); checkpoint: the summary runs under activation checkpointing and is "
    "recomputed in backward.",
    analysis.OVERLAP.field: "overlap: the outputs' part that does not read the entering state is computed "
    "while the summary exchange is in flight (one more chunk scan of work for the exchange's latency).",
}


def ablation_blocks(runs: Sequence[ReportRun], scenario: str) -> list:
    blocks: list = []
    for switch in (analysis.CHECKPOINT, analysis.OVERLAP):
        found = False
        for r in runs:
            rows = [a for a in analysis.ablation(r.run, switch) if a.scenario == scenario]
            if rows:
                found = True
                name = f"{switch.title}: {scenario}"
                blocks.append(_ablation_table(rows, f"{r.label}: {name}" if len(runs) > 1 else name))
        if found:
            blocks.append(
                Paragraph(
                    text=f"{ABLATION_NOTES[switch.field]} time and memory: {switch.on_label} relative to "
                    f"{switch.off_label} (time +x%: slower, with its 95% interval across rounds where there "
                    "are two or more; within noise: the interval holds 0; memory -y MiB: less peak "
                    "allocated). " + TIME_NOTE,
                    small=True,
                )
            )
    return blocks


def _noise(p: ScalingPoint) -> str:
    """What a reader must know beside a scaling figure: within noise, and its caveat (ScalingPoint.caveat)."""
    return (" within noise" if p.within_noise else "") + (f" ({p.caveat})" if p.caveat else "")


CAVEAT_NOTE = (
    "contended: a side was timed on a shared machine, so no efficiency is given; implausible: above ideal "
    "(efficiency over 100%): the ranks shared cores or the rounds drifted, not CP's doing; interval past "
    "ideal: its interval holds such values"
)


def _speedup(p: ScalingPoint) -> str:
    """`1.62x [1.41, 1.86] (81%)`: a strong-scaling speedup, its interval and the efficiency."""
    return f"{format_ratio(p.interval)} ({100 * p.efficiency:.0f}%)"


def _scaling_cell(p: ScalingPoint, figure: Callable[[ScalingPoint], str]) -> str:
    """A scaling figure with its flags, or only the flag where a side was contended."""
    return "- (contended)" if p.contended and p.cp > 1 else figure(p) + _noise(p)


def _percent(interval: RatioInterval) -> str:
    """`95% [88, 102]`: a weak-scaling efficiency and its interval, in %."""
    if interval.low is None or interval.high is None:
        return f"{100 * interval.ratio:.0f}%"
    return f"{100 * interval.ratio:.0f}% [{100 * interval.low:.0f}, {100 * interval.high:.0f}]"


def _scaling_table(
    title: str,
    first: str,
    rows: Sequence[tuple[int, str, list[ScalingPoint]]],
    degrees: Sequence[int],
    cell: Callable[[ScalingPoint], str],
) -> Table:
    table_rows = []
    for length, label, points in rows:
        by_cp = {p.cp: p for p in points}
        base = format_time(points[0].base)
        table_rows.append(
            [format_tokens(length), label, base]
            + [cell(by_cp[cp]) if cp in by_cp else "-" for cp in degrees if cp != 1]
        )
    return Table(
        title=title,
        columns=[first, "mode", "t(cp=1)"] + [f"CP{cp}" for cp in degrees if cp != 1],
        rows=table_rows,
        align=["right", "left"] + ["right"] * (len(degrees)),
    )


@dataclass(frozen=True)
class _ScalingKind:
    """One scaling table's facts: which lengths it sweeps, its points at one, its title and its cells."""

    lengths: Callable[[RunResult, str], list[int]]
    points: Callable[[RunResult, str, Any, str, int], list[ScalingPoint]]
    title: str
    first: str
    cell: Callable[[ScalingPoint], str]


_STRONG = _ScalingKind(
    lengths=analysis.strong_lengths,
    points=lambda run, name, v, pass_, n: analysis.strong_scaling(run, name, v, pass_, seq_len=n),
    title="strong scaling, speedup t(cp=1)/t(cp) [95% interval] (efficiency = speedup / cp)",
    first="global seq",
    cell=lambda p: _scaling_cell(p, _speedup),
)
_WEAK = _ScalingKind(
    lengths=analysis.weak_lengths,
    points=lambda run, name, v, pass_, n: analysis.weak_scaling(run, name, v, pass_, local_seq_len=n),
    title="weak scaling, efficiency t(cp=1)/t(cp) [95% interval] at a fixed length per rank",
    first="per rank",
    cell=lambda p: _scaling_cell(p, lambda q: _percent(q.interval)),
)


def scaling_blocks(runs: Sequence[ReportRun], name: str) -> list:
    blocks: list = []
    for r in runs:
        prefix = f"{r.label}: " if len(runs) > 1 else ""
        degrees = analysis.cps(r.run, name)
        variants = analysis.variants(r.run, name)
        for pass_ in analysis.passes(r.run, name):
            for kind in (_STRONG, _WEAK):
                rows = [
                    (n, v.label, pts)
                    for n in kind.lengths(r.run, name)
                    for v in variants
                    if len(pts := kind.points(r.run, name, v, pass_, n)) > 1
                ]
                if rows:
                    title = f"{prefix}{name}, {PASS_LABELS[pass_]}: {kind.title}"
                    blocks.append(_scaling_table(title, kind.first, rows, degrees, kind.cell))
    if blocks:
        blocks.append(
            Paragraph(
                text="Ideal: strong scaling speedup = cp (efficiency 100%); weak scaling efficiency 100% (as "
                "many tokens per rank, as much time). Ratios of the cases' estimates, with the 95% interval "
                "across rounds; within noise: the interval holds 1 (this run cannot tell t(cp) from "
                "t(cp=1)). Summary modes with summary checkpoint on where it ran. "
                + CAVEAT_NOTE
                + ". "
                + TIME_NOTE,
                small=True,
            )
        )
    return blocks
