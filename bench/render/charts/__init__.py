"""Scaling charts from result files: one matplotlib Figure per chart, saved as PNG and SVG.

Charts, with stable file names so that the README can embed them (`<name>.png`, `<name>.svg`):

    time_vs_seq          time vs global sequence length per mode; rows forward / forward+backward, one
                         panel per CP degree; log-log, bars = IQR over repeats
    throughput_vs_seq    the same as tokens/s (global tokens / median time): higher is better
    weak_scaling         fixed tokens per rank: time vs CP degree, with the ideal flat line at t(cp=1)
    strong_scaling       fixed global sequence: speedup t(cp=1) / t(cp) vs CP degree, ideal speedup = cp
    memory_vs_seq        peak allocated vs global sequence length per mode, one panel per CP degree; log-log
    comm_vs_seq          bytes sent + received by the busiest rank per pass, per mode and CP degree > 1
                         (bench.judge.traffic: the communication model, equal to the counted bytes)
    checkpoint_summary   summary checkpoint on vs off (summary modes): time cost (%) and memory saved (MiB)
    overlap_ablation     overlap on vs off (the summary modes): the same two panels

Several result files overlay as series: colour = mode, line style and marker = file (branch@commit), as
small multiples (a panel per mode, whose series are the files; the ablations a pair of panels a file); a
scenario's charts show only the files that measured it. How points are marked (contended, off-scale, cut
intervals, the dotted ideal) is decided once, in style; a figure is at most axes.MAX_FIGURE_WIDTH_IN wide,
so that the HTML report shows its text readable. A
chart that the results cannot support (no weak-scaling sweep, no checkpoint-off case, ...) is skipped with
a one-line reason. When the files hold several scenarios, each gets its own charts, named
`<scenario>-<name>`. Figures are built with matplotlib's object API (no pyplot, no global state); PNGs
are rendered by the Agg canvas, so no display is needed.

The modules, lowest first: chart (Chart: a figure, its name, saving), style (a series' colour, marker and
line, bars, the contended mark), sources (Source, and what a chart reads of the runs), axes (the panels and
their axes), footnotes (title, legend, footnote); one module per family: per_length (time, throughput and
memory vs length), scaling (weak, strong), ablation (summary checkpoint, overlap), communication; history
(the history site's chart of a case); catalogue (BUILDERS, and the charts of a scenario).
"""

from bench.render.charts.ablation import checkpoint_summary, overlap_ablation
from bench.render.charts.catalogue import (
    BUILDERS,
    TITLES,
    build_charts,
    by_machine,
    machine_of,
    scenario_charts,
)
from bench.render.charts.chart import DPI, FORMATS, Chart
from bench.render.charts.communication import comm_vs_seq
from bench.render.charts.history import history_chart
from bench.render.charts.per_length import memory_vs_seq, throughput_vs_seq, time_vs_seq
from bench.render.charts.scaling import strong_scaling, weak_scaling
from bench.render.charts.sources import Source, sources_for
from bench.render.charts.style import MODE_STYLES, UNKNOWN_MODE_STYLE, mode_style

__all__ = [
    "BUILDERS",
    "DPI",
    "FORMATS",
    "MODE_STYLES",
    "TITLES",
    "UNKNOWN_MODE_STYLE",
    "Chart",
    "Source",
    "build_charts",
    "by_machine",
    "checkpoint_summary",
    "comm_vs_seq",
    "history_chart",
    "machine_of",
    "memory_vs_seq",
    "mode_style",
    "overlap_ablation",
    "scenario_charts",
    "sources_for",
    "strong_scaling",
    "throughput_vs_seq",
    "time_vs_seq",
    "weak_scaling",
]
