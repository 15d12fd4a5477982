"""The history site's chart of one case (bench.render.history draws it on the case's page): its time (the
estimate with its 95% interval) and its peak memory against commit order, the change points where they
start. A slot per run whose file has the case (and per commit whose bench could not run, greyed); the time
axis from 0 to its points, an interval reaching far past them cut at the top and marked."""

from __future__ import annotations

import math
from bisect import bisect_left

from matplotlib.figure import Figure

from bench.formats import format_seconds
from bench.judge.history import CaseHistory, History
from bench.measure.memory import MEMORY_RESOLUTION_MIB
from bench.render.charts.axes import from_zero
from bench.render.charts.chart import Chart
from bench.render.charts.style import contended_handle, mark_contended, off_scale_handles

CHART_DPI = 96
"""Lower than the report's: a page holds a chart per case (about 60 KB each at this resolution); at 96 the
page shows the figure at its size in inches, its 8-pt commit labels at 11 px."""
COLOURS = {"worse": "#c62828", "better": "#2e7d32"}
"""A step up in time (a regression) and a step down."""
TIME_MARKER_PT = 6.0
LABEL_PT = 8.0
LABEL_PITCH_PT = 11.0
"""The least room along the axis a (rotated) commit label takes: more commits than fit label every k-th."""


def slots(history: History, case: CaseHistory) -> list[int]:
    """The runs the chart has a slot for, by index into history.runs: those whose file has the case (ok or
    not), and the commits whose bench could not run (it may have had the case)."""
    return [
        i
        for i, run in enumerate(history.runs)
        if run.run is None or run.run.get(case.key) is not None or case.results[i] is not None
    ]


def history_chart(history: History, case: CaseHistory) -> Chart:
    """Time (estimate and interval, ms) and peak memory (MiB) against commit order, steps marked."""
    fig = Figure(figsize=(9.5, 4.6), layout="constrained", dpi=CHART_DPI)
    ax_t, ax_m = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    shown = slots(history, case)
    xs_ok, times, down, up, memory, results = [], [], [], [], [], []
    for x, i in enumerate(shown):
        result = case.results[i]
        if result is None or result.estimate is None:
            continue
        est = result.estimate
        xs_ok.append(x)
        results.append(result)
        times.append(est.median_s * 1e3)
        down.append((est.median_s - (est.low_s or est.median_s)) * 1e3)
        up.append(((est.high_s or est.median_s) - est.median_s) * 1e3)
        if result.memory is not None:
            memory.append((x, result.memory.peak_mib))
    ax_t.errorbar(
        xs_ok, times, yerr=[down, up], fmt="o-", ms=TIME_MARKER_PT, capsize=3, color="#1565c0", lw=1
    )
    # a contended run's point is ringed: its time is not the code's alone
    mark_contended(ax_t, xs_ok, times, results, TIME_MARKER_PT)
    ax_m.plot([x for x, _ in memory], [m for _, m in memory], "s-", color="#6a1b9a", lw=1, ms=4)
    for x, i in enumerate(shown):
        if history.runs[i].run is None:  # the commit's bench could not run
            for ax in (ax_t, ax_m):
                ax.axvspan(x - 0.4, x + 0.4, color="#bbbbbb", alpha=0.4, lw=0)
    for change in case.changes:
        x = bisect_left(shown, change.index) - 0.5  # before the first run of the new level
        for ax in (ax_t, ax_m):
            ax.axvline(x, color=COLOURS[change.verdict], ls="--", lw=1.2)
        ax_t.annotate(
            f"{change.ratio.ratio:.2f}x {change.effect}",
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            color=COLOURS[change.verdict],
            fontsize=8,
        )
    marks = from_zero([[ax_t]], [max(times, default=0.0)], lambda ms: format_seconds(ms / 1e3))
    if memory:  # a flat line stays flat: the axis spans at least the meter's resolution either side
        peaks = [m for _, m in memory]
        middle = (max(peaks) + min(peaks)) / 2
        half = max((max(peaks) - min(peaks)) / 2 * 1.2, MEMORY_RESOLUTION_MIB)
        ax_m.set_ylim(middle - half, middle + half)
    ax_t.set_ylabel("time (ms)")
    ax_m.set_ylabel("peak MiB")
    _commit_axis(ax_m, [history.runs[i].commit.short for i in shown])
    ax_m.set_xlabel("commit (oldest first; grey: its bench could not run)")
    for ax in (ax_t, ax_m):
        ax.grid(True, alpha=0.3)
    handles = off_scale_handles(marks)
    if any(r.contended for r in results):
        handles.append(contended_handle("contended"))
    if handles:  # beside the panels, never over a point
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    fig.suptitle(f"{case.key} · {history.machine}", fontsize=10)
    title = f"{case.key}: time and peak memory by commit"
    return Chart(name=case.key.replace("/", "--"), title=title, figure=fig, dpi=CHART_DPI)


def _commit_axis(ax, labels: list[str]) -> None:
    """A tick per slot; a label on every one that the axis has room for (every k-th when crowded)."""
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    every = max(1, math.ceil(len(labels) * LABEL_PITCH_PT / width_pt))
    shown = [label if k % every == 0 else "" for k, label in enumerate(labels)]
    ax.set_xticks(range(len(labels)), shown, rotation=60, fontsize=LABEL_PT, ha="right")
    ax.set_xlim(-0.6, len(labels) - 0.4)
