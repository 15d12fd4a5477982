"""The switch ablations of the summary modes, on against off at each (CP degree, length) point: time cost (%)
and peak memory saved (MiB), a pair of panels a file. checkpoint_summary (summary checkpoint) and
overlap_ablation (overlap)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from bench.formats import format_tokens
from bench.judge import analysis
from bench.judge.analysis import PASS_LABELS, Variant
from bench.measure.memory import MEMORY_RESOLUTION_MIB
from bench.render.charts.axes import LEGEND_WIDTH_IN, MAX_FIGURE_WIDTH_IN, spread
from bench.render.charts.footnotes import finish
from bench.render.charts.sources import Source
from bench.render.charts.style import bar_style


def _memory_drawn(row: analysis.AblationRow) -> bool:
    """Whether the memory a switch saves at a point is drawn: measured, and at least MEMORY_RESOLUTION_MIB."""
    return row.memory_saved_mib is not None and abs(row.memory_saved_mib) >= MEMORY_RESOLUTION_MIB


def _no_effect(ax, text: str) -> None:
    """A panel that says why it has no bars (every effect within noise) instead of drawing noise; it has no
    zero line or grid (_ablation_axes) to run through the text."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="dimgray")
    ax.tick_params(axis="y", left=False, labelleft=False)  # not set_yticks: the y axis may be shared


def _ablation_rows(
    sources: Sequence[Source], scenario: str, switch: analysis.Switch
) -> dict[str, list[analysis.AblationRow]]:
    """Source label -> the rows of `switch` on against off in `scenario`, from that source's run."""
    return {s.label: [r for r in analysis.ablation(s.run, switch) if r.scenario == scenario] for s in sources}


def _ablation_bars(
    ax_time: Any,
    ax_mem: Any,
    found: list[analysis.AblationRow],
    xs: list[float],
    style: dict[str, Any],
    *,
    time_noise: bool,
) -> None:
    """Nothing; draws one group's bars at `xs`: time cost with its spread (unless every effect is noise)
    and the memory saved where drawn (_memory_drawn)."""
    costs = [r.time_cost_pct for r in found]
    spreads = [r.time_cost_range_pct for r in found]
    if not time_noise:
        ax_time.bar(
            xs,
            costs,
            yerr=spread(costs, spreads),
            capsize=2,
            error_kw={"linewidth": 0.8},
            **style,
        )
    saved = [(x, r.memory_saved_mib) for x, r in zip(xs, found, strict=True) if _memory_drawn(r)]
    ax_mem.bar([x for x, _ in saved], [m for _, m in saved], **style)


def _ablation_axes(
    ax_time: Any,
    ax_mem: Any,
    switch: analysis.Switch,
    points: list[tuple[int, int]],
    passes: set[str],
    file_label: str | None,
    empty: tuple[bool, bool],
) -> None:
    """Nothing; sets both panels' titles (after `file_label` where several files have panels), labels, ticks
    (one per (cp, length) point), and the zero line and grid of a panel with bars (`empty`: whether the time
    and the memory panel have none)."""
    labels = [f"CP{cp}\n{format_tokens(n)}" for cp, n in points]
    pass_label = " / ".join(PASS_LABELS[p] for p in analysis.PASSES if p in passes)
    prefix = f"{file_label}: " if file_label is not None else ""
    for ax, title, unit, no_bars in (
        (
            ax_time,
            f"{prefix}time cost of {switch.on_label}, {pass_label} (above 0: slower)",
            "time cost (%)",
            empty[0],
        ),
        (
            ax_mem,
            f"{prefix}peak allocated memory saved by {switch.on_label} (above 0: less memory)",
            "memory saved (MiB)",
            empty[1],
        ),
    ):
        ax.set_xticks(range(len(points)), labels, fontsize=8)
        ax.set_xlim(-0.7, len(points) - 0.3)
        ax.tick_params(axis="x", labelbottom=True)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(unit)
        if not no_bars:
            ax.axhline(0, color="black", linewidth=0.8)
            ax.grid(True, axis="y", alpha=0.3)
    ax_mem.set_xlabel("CP degree, global sequence length")


PANEL_HEIGHT_IN = (3.1, 2.5)
"""Inches of a panel with one file, and with several (twice as many panels a file)."""
BAR_WIDTH_IN = 0.28
"""The width a bar would like; the figure is at most MAX_FIGURE_WIDTH_IN, bars narrow to fit."""


def _ablation_chart(sources: Sequence[Source], scenario: str, switch: analysis.Switch) -> Figure | str:
    """Time cost (%) and memory saved (MiB) of `switch` on against off, per point and mode: a time panel
    and a memory panel for each file that ran the switch both ways (the time panels first, then the memory
    panels, each kind on one y axis). A panel whose every effect is within noise (each of its file's time
    intervals holds 0; each memory delta below MEMORY_RESOLUTION_MIB) says so instead of drawing bars."""
    rows = _ablation_rows(sources, scenario, switch)
    if not any(rows.values()):
        return f"no {'/'.join(switch.modes)} case ran with {switch.on_label} both on and off"
    drawn = [s for s in sources if rows[s.label]]
    every = [r for rs in rows.values() for r in rs]
    points = sorted({(r.cp, r.seq_len) for r in every})
    modes = [m for m in switch.modes if any(r.mode == m for r in every)]
    passes = {r.pass_ for r in every}
    want = max(6.0, BAR_WIDTH_IN * len(points) * len(modes) + 0.5 * len(points))
    width_in = min(want, MAX_FIGURE_WIDTH_IN - LEGEND_WIDTH_IN)
    height = PANEL_HEIGHT_IN[len(drawn) > 1] * 2 * len(drawn)
    fig = Figure(figsize=(width_in + LEGEND_WIDTH_IN, height), layout="constrained")
    axes = list(fig.subplots(2 * len(drawn), 1, sharex=True, squeeze=False)[:, 0])
    time_axes, mem_axes = axes[: len(drawn)], axes[len(drawn) :]
    for ax in time_axes[1:]:
        ax.sharey(time_axes[0])
    for ax in mem_axes[1:]:
        ax.sharey(mem_axes[0])
    width = min(0.8 / len(modes), 0.3)  # a lone point keeps slim bars
    for ax_time, ax_mem, s in zip(time_axes, mem_axes, drawn, strict=True):
        own = rows[s.label]
        time_noise = all(r.within_noise for r in own)
        memory_noise = not any(_memory_drawn(r) for r in own)
        for g, mode in enumerate(modes):
            by_point = {(r.cp, r.seq_len): r for r in own if r.mode == mode}
            xs = [x + (g - (len(modes) - 1) / 2) * width for x, p in enumerate(points) if p in by_point]
            found = [by_point[p] for p in points if p in by_point]
            if found:
                _ablation_bars(ax_time, ax_mem, found, xs, bar_style(mode, width), time_noise=time_noise)
        label = s.label if len(drawn) > 1 else None
        _ablation_axes(ax_time, ax_mem, switch, points, passes, label, (time_noise, memory_noise))
        if time_noise:
            _no_effect(ax_time, f"no time cost told from noise: every 95% interval of {len(own)} holds 0")
        if memory_noise:
            _no_effect(ax_mem, f"no memory saved above the meter's resolution ({MEMORY_RESOLUTION_MIB} MiB)")
    finish(
        fig,
        title=switch.title,
        scenario=scenario,
        sources=drawn,
        variants=[Variant(m, True) for m in modes],
        note=f"time cost: t({switch.on_label} on) / t(off) - 1, the ratio of the round medians (bars: its "
        "95% interval across rounds, or the IQRs with one round; a bar across 0 is within noise); memory "
        f"saved: peak allocated off - on, drawn from {MEMORY_RESOLUTION_MIB} MiB (one reading a case: no "
        "interval)",
        bars=True,
        files_apart=False,
    )
    return fig


def checkpoint_summary(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _ablation_chart(sources, scenario, analysis.CHECKPOINT)


def overlap_ablation(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _ablation_chart(sources, scenario, analysis.OVERLAP)
