"""The scaling charts, the CP degree on x: weak_scaling (fixed tokens per rank: time, ideal flat at
t(cp=1)) and strong_scaling (fixed global sequence: speedup t(cp=1) / t(cp), ideal speedup = cp)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from bench.formats import format_seconds, format_tokens
from bench.judge import analysis
from bench.judge.analysis import PASS_LABELS, Variant
from bench.render.charts.axes import (
    BAR_CLIP,
    cp_axis,
    from_zero,
    panel_figure,
    panel_grid,
    panel_title,
    spread,
)
from bench.render.charts.footnotes import finish
from bench.render.charts.sources import TIME_NOTE, Source, all_variants, ms, union
from bench.render.charts.style import IDEAL, mark_contended, mode_style, off_scale_handles, series_style
from bench.results.store import RunResult


@dataclass(frozen=True)
class ScalingChart:
    """What a scaling chart (weak or strong) draws: a panel per (pass, length), the CP degree on x."""

    lengths: Callable[[RunResult, str], list[int]]
    """The panel lengths a file has for a scenario (analysis.weak_lengths or strong_lengths)."""
    points: Callable[[RunResult, str, Variant, str, int], list[analysis.ScalingPoint]]
    """A file's points of (scenario, variant, pass, the panel's length), by CP degree."""
    draw: Callable[[Any, int, Variant, list[analysis.ScalingPoint]], list[float]]
    """Draws one series (axes, file index, variant, its points); returns the heights drawn."""
    none: str
    """What is said when no file has a panel."""
    panel_text: Callable[[str, int], str]
    ylabel: str
    title: str
    note: str
    ideal: Line2D
    """The legend entry of the ideal line."""
    value_text: Callable[[float], str]
    """How an off-scale point's value is written (style.mark_off_scale)."""
    ideal_line: Callable[[Any, list[int]], float] | None = None
    """Draws a panel's ideal line over its degrees, returning its highest point (kept in view)."""


def _scaling(chart: ScalingChart, sources: Sequence[Source], scenario: str) -> Figure | str:
    lengths = union(sources, lambda r: chart.lengths(r, scenario))
    if not lengths:
        return chart.none
    grid = panel_grid(sources, scenario, lengths)
    fig, axes = panel_figure(len(grid), len(grid[0]))
    highest = [0.0] * len(grid)
    drawn: set[Variant] = set()
    for row, panels in enumerate(grid):
        for col, (pass_, length, shown) in enumerate(panels):
            ax = axes[row][col]
            degrees: set[int] = {1}
            for i, s in enumerate(sources):
                for v in shown:
                    points = chart.points(s.run, scenario, v, pass_, length)
                    if len(points) > 1:  # a series of cp=1 alone draws no scaling
                        drawn.add(v)
                    if points:
                        degrees.update(p.cp for p in points)
                        highest[row] = max([highest[row], *chart.draw(ax, i, v, points)])
            ordered = sorted(degrees)
            if chart.ideal_line is not None:
                highest[row] = max(highest[row], chart.ideal_line(ax, ordered))
            cp_axis(ax, ordered)
            ax.set_title(panel_title(sources, shown, chart.panel_text(pass_, length), ax), fontsize=9)
            if col == 0:
                ax.set_ylabel(chart.ylabel)
            ax.grid(True, alpha=0.3)
    marks = from_zero(axes, highest, chart.value_text)
    variants = [v for v in all_variants(sources, scenario) if v in drawn]  # the legend names what is drawn
    finish(
        fig,
        title=chart.title,
        scenario=scenario,
        sources=sources,
        variants=variants,
        note=chart.note,
        extra=[chart.ideal, *off_scale_handles(marks)],
    )
    return fig


def _draw_weak(ax: Any, i: int, v: Variant, points: list[analysis.ScalingPoint]) -> list[float]:
    cps, times_ = [p.cp for p in points], [ms(p.result) for p in points]
    times = [m for m, _, _ in times_]
    yerr = [[lo for _, lo, _ in times_], [hi for _, _, hi in times_]]
    style = series_style(i, v.mode)
    ax.errorbar(cps, times, yerr=yerr, capsize=2, **style)
    mark_contended(ax, cps, times, [p.result for p in points], style["markersize"])
    # Ideal weak scaling: as many tokens per rank, as much time as on one rank.
    ax.axhline(times[0], color=mode_style(v.mode)[0], alpha=0.6, **IDEAL)
    return times


IMPLAUSIBLE_CLIP = 1.25
"""A speedup above this many times its CP degree is not kept in view: drawn off-scale, its value written."""


def _draw_strong(ax: Any, i: int, v: Variant, points: list[analysis.ScalingPoint]) -> list[float]:
    cps, ratios = [p.cp for p in points], [p.ratio for p in points]
    yerr = spread(ratios, [p.ratio_range for p in points])
    style = series_style(i, v.mode)
    ax.errorbar(cps, ratios, yerr=yerr, capsize=2, **style)
    # a ratio is as contended as either of its two cases
    contended = [p.result if p.result.contended else p.base for p in points]
    mark_contended(ax, cps, ratios, contended, style["markersize"])
    for p in points:  # a speedup past the CP degree is not CP's: ringed and named where it is in view
        if p.caveat == "implausible: above ideal":
            ax.plot([p.cp], [p.ratio], "o", color="#c62828", ms=style["markersize"] + 12, mfc="none", mew=1.5)
            ax.annotate(
                "above ideal",
                (p.cp, p.ratio),
                xytext=(8, 6),
                textcoords="offset points",
                fontsize=7,
                color="#c62828",
            )
    # the axis follows what CP can do: one impossible point must not flatten the ideal line and the rest
    return [r for r, p in zip(ratios, points, strict=True) if r <= IMPLAUSIBLE_CLIP * p.cp]


def _speedup_equals_cp(ax: Any, degrees: list[int]) -> float:
    ax.plot(degrees, degrees, color="black", **IDEAL)
    return float(degrees[-1])


WEAK = ScalingChart(
    lengths=analysis.weak_lengths,
    points=lambda run, scenario, v, pass_, n: analysis.weak_scaling(run, scenario, v, pass_, local_seq_len=n),
    draw=_draw_weak,
    none="no weak-scaling sweep (local_seq_len) measured at cp=1 and a larger CP degree",
    panel_text=lambda pass_, local: f"{PASS_LABELS[pass_]}, {format_tokens(local)} tokens per rank",
    ylabel="time (ms)",
    title="Weak scaling: fixed tokens per rank",
    note=TIME_NOTE + f"; bars past {BAR_CLIP}x a row's largest point are cut at its top; the global sequence "
    "grows with the CP degree",
    ideal=Line2D([], [], color="gray", alpha=0.6, **{**IDEAL, "label": "ideal: flat at t(cp=1)"}),
    value_text=lambda ms_: format_seconds(ms_ / 1e3),
)
STRONG = ScalingChart(
    lengths=analysis.strong_lengths,
    points=lambda run, scenario, v, pass_, n: analysis.strong_scaling(run, scenario, v, pass_, seq_len=n),
    draw=_draw_strong,
    none="no global sequence length measured at cp=1 and a larger CP degree",
    panel_text=lambda pass_, seq_len: f"{PASS_LABELS[pass_]}, global {format_tokens(seq_len)}",
    ylabel="speedup over cp=1",
    title="Strong scaling: fixed global sequence",
    note="speedup: t(cp=1) / t(cp) of the estimates; bars: its 95% interval across rounds (one round: from "
    f"the interquartile ranges), cut at the top past {BAR_CLIP}x a row's largest point; ringed red: above "
    f"ideal (efficiency over 100%), not CP's doing (shared cores, drift); a speedup past {IMPLAUSIBLE_CLIP}x "
    "its CP degree does not stretch the axis: above it, an arrow at the top and its value",
    ideal=Line2D([], [], color="black", **{**IDEAL, "label": "ideal: speedup = CP degree"}),
    value_text=lambda speedup: f"{speedup:.1f}x",
    ideal_line=_speedup_equals_cp,
)


def weak_scaling(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _scaling(WEAK, sources, scenario)


def strong_scaling(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _scaling(STRONG, sources, scenario)
