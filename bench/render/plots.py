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

Several result files overlay as series: colour = mode, line style and marker = file (branch@commit); a
scenario's charts show only the files that measured it. A
chart that the results cannot support (no weak-scaling sweep, no checkpoint-off case, ...) is skipped with
a one-line reason. When the files hold several scenarios, each gets its own charts, named
`<scenario>-<name>`. Figures are built with matplotlib's object API (no pyplot, no global state); PNGs
are rendered by the Agg canvas, so no display is needed.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

from bench.judge import analysis
from bench.judge.analysis import PASS_LABELS, Variant, source_label
from bench.judge.traffic import bytes_moved
from bench.measure.memory import MEMORY_RESOLUTION_MIB
from bench.render.formats import contended_cases, format_tokens, incomplete_summary, mostly_contended
from bench.results.store import CaseResult, RunResult
from gdn_cp.distributed import MODES, mode_order

FORMATS = ("png", "svg")
DPI = 150
MODE_STYLES: tuple[tuple[str, str], ...] = (
    ("#1f77b4", "o"),
    ("#ff7f0e", "s"),
    ("#2ca02c", "^"),
    ("#d62728", "D"),
)
"""(matplotlib colour, marker) of the registered modes, in the registry's display order (ulysses, p2p,
all_gather, scan; a test keeps one per mode)."""
UNKNOWN_MODE_STYLE = ("gray", "o")
"""Colour and marker of a mode this bench does not know (results written by another version)."""


def mode_style(mode: str) -> tuple[str, str]:
    """(colour, marker) of `mode`."""
    return MODE_STYLES[MODES.index(mode)] if mode in MODES else UNKNOWN_MODE_STYLE


"""A marker per mode as well as a colour, so that lines lying on top of each other stay visible."""
SOURCE_LINES = ["-", "--", ":", "-."]
"""Line style of the 1st, 2nd, ... result file (later files also get hollow markers)."""
SOURCE_HATCHES = ["", "//", "..", "xx"]
IDEAL_FLAT = {"linestyle": (0, (1, 5)), "linewidth": 1.2}
"""Weak scaling's ideal line: sparse dots, unlike any file's line style (SOURCE_LINES), so that a third
file's dotted series is not read as an ideal."""
PANEL_SIZE = (3.6, 2.9)
"""Inches per panel."""


@dataclass(frozen=True, slots=True)
class Source:
    """One result file as a series of the charts."""

    label: str
    """How the legend names it: branch@commit."""
    run: RunResult


@dataclass(slots=True)
class Chart:
    """A rendered chart, ready to save."""

    name: str
    """Stable file stem: time_vs_seq, ... (prefixed with the scenario when there are several)."""
    title: str
    figure: Figure
    dpi: int = DPI
    """Resolution of its PNG."""

    def save(self, out_dir: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for fmt in formats:
            path = out_dir / f"{self.name}.{fmt}"
            # A fixed salt for the SVG's ids and no date: an unchanged chart rewrites an identical file,
            # so re-rendering the committed charts shows no diff.
            metadata = {"Date": None} if fmt == "svg" else None
            with matplotlib.rc_context({"svg.hashsalt": "gdn-cp-bench"}):
                self.figure.savefig(path, format=fmt, dpi=self.dpi, bbox_inches="tight", metadata=metadata)
            paths.append(path)
        return paths

    def png_bytes(self) -> bytes:
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=self.dpi, bbox_inches="tight")
        return buf.getvalue()


def sources_for(runs: Sequence[RunResult]) -> list[Source]:
    """Label each run branch@commit; runs that would share a label get the run's name (its scenarios)
    appended, and a number after it where that is shared too: `main@6b5f0a48 (verify-cpu-verify, 2)`."""
    labels = [source_label(r) for r in runs]
    named = [f"{label} ({r.name}" for label, r in zip(labels, runs, strict=True)]
    out = []
    for i, (label, by_run, run) in enumerate(zip(labels, named, runs, strict=True)):
        if labels.count(label) == 1:
            out.append(Source(label=label, run=run))
        elif named.count(by_run) == 1:
            out.append(Source(label=f"{by_run})", run=run))
        else:
            out.append(Source(label=f"{by_run}, {named[: i + 1].count(by_run)})", run=run))
    return out


# ----------------------------------------------------------------------------------------------------------
# Shared decoration


def _identity(sources: Sequence[Source]) -> str:
    """Second title line: the device(s) and the commit(s)."""
    devices = list(
        dict.fromkeys(
            f"{s.run.environment.device_type} ({s.run.environment.device_name}, {s.run.environment.backend})"
            for s in sources
        )
    )
    return f"{' / '.join(devices)} · {' vs '.join(s.label for s in sources)}"


def _footer(sources: Sequence[Source], scenario: str, note: str) -> str:
    lines = []
    for s in sources:
        e = s.run.environment
        repeats = sorted({c.case.repeat for c in s.run.cases if c.case.scenario == scenario})
        prefix = f"{s.label}: " if len(sources) > 1 else ""
        lines.append(
            f"{prefix}host {e.hostname}: {e.cpu_model}, {e.cpu_count} cores; "
            f"threads per rank {analysis.threads_by_cp(s.run, scenario)}; torch {e.torch_version}"
            + (f", torch-npu {e.torch_npu_version}" if e.torch_npu_version else "")
            + f"; layer {analysis.describe_layer(s.run.scenarios.get(scenario, {}))}; "
            f"repeats {'/'.join(map(str, repeats))}"
        )
        short = incomplete_summary(s.run)
        if short is not None:  # the flag every view carries (bench.render.formats)
            lines.append(f"{prefix}INCOMPLETE: {short}")
    lines.append(note)
    return "\n".join(lines)


def _figure(rows: int, cols: int) -> tuple[Figure, list[list]]:
    """A grid of panels; panels of a row share their y axis, so that they compare at a glance."""
    fig = Figure(figsize=(PANEL_SIZE[0] * cols + 1.8, PANEL_SIZE[1] * rows + 1.0), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey="row")
    return fig, [list(r) for r in axes]


CONTENDED_STYLE = {
    "marker": "X",
    "markersize": 9,
    "linestyle": "none",
    "color": "black",
    "markerfacecolor": "none",
    "zorder": 5,
}
"""A cross over every point timed only while the machine was shared (CaseResult.contended): a chart never
shows such a point as clean."""


def _mark_contended(ax, xs: Sequence[float], ys: Sequence[float], results: Sequence[CaseResult]) -> None:
    """Cross the points whose case (or, for a ratio, either case) was contended."""
    hits = [(x, y) for x, y, r in zip(xs, ys, results, strict=True) if r.contended]
    if hits:
        ax.plot([x for x, _ in hits], [y for _, y in hits], **CONTENDED_STYLE)


FOOTER_PT = 8.0
"""The footnote's size: as large as the legend's, readable in the PNG at its dpi (6.5 pt read as ~7 px)."""
FOOTER_CHARS_PER_INCH = 18
"""Characters of the FOOTER_PT footer per inch of figure width (DejaVu Sans: about half a point of width
per point of size a character)."""


def _finish(
    fig: Figure,
    *,
    title: str,
    scenario: str,
    sources: Sequence[Source],
    variants: Sequence[Variant],
    note: str,
    extra: Sequence[Line2D | Patch] = (),
    bars: bool = False,
    timed: bool = True,
) -> None:
    """Title (chart, scenario, device and commits; on a chart of times (`timed`), MOSTLY CONTENDED first when
    more than half of the scenario's cases were timed on a shared machine), legend outside the panels,
    footer under them. Bytes and peak memory do not depend on what else ran: their charts are not marked."""
    cases = [c for s in sources for c in s.run.cases if c.case.scenario == scenario]
    shared, measured = contended_cases(cases) if timed else (0, 0)
    warning = "MOSTLY CONTENDED: timed on a shared machine\n" if timed and mostly_contended(cases) else ""
    fig.suptitle(f"{warning}{title} · {scenario}\n{_identity(sources)}", fontsize=11)
    handles: list[Line2D | Patch] = []
    for v in variants:
        color = mode_style(v.mode)[0]
        if bars:
            handles.append(Patch(facecolor=color, label=v.label))
        else:
            handles.append(Line2D([], [], color=color, marker=mode_style(v.mode)[1], label=v.label))
    if len(sources) > 1:
        for i, s in enumerate(sources):
            if bars:
                hatch = SOURCE_HATCHES[i % len(SOURCE_HATCHES)]
                handles.append(Patch(facecolor="white", edgecolor="gray", hatch=hatch, label=s.label))
            else:
                ls = SOURCE_LINES[i % len(SOURCE_LINES)]
                handles.append(Line2D([], [], color="gray", linestyle=ls, label=s.label))
    handles += extra
    if shared and not bars:
        handles.append(Line2D([], [], **{**CONTENDED_STYLE, "label": f"contended ({shared} of {measured})"}))
    checkpointed = [v.mode for v in variants if v.checkpoint]
    if checkpointed and not bars:
        note += f"; {', '.join(checkpointed)}: summary checkpoint on"
    # centred on the right: the title spans the figure, and an upper legend would sit under its end
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False)
    # Wrapped to the figure's width: saved with a tight box, a longer line would widen the image with
    # empty space beside the panels.
    width = max(60, int(fig.get_figwidth() * FOOTER_CHARS_PER_INCH))
    footer = "\n".join(
        textwrap.fill(line, width, subsequent_indent="  ")
        for line in _footer(sources, scenario, note).split("\n")
    )
    fig.text(0.0, 0.0, footer, fontsize=FOOTER_PT, color="dimgray", va="top", ha="left")


BAR_CLIP = 1.6
"""An interval reaching past this many times a row's largest point is cut at the panel's top: one wide
interval (a case of few or noisy rounds) must not flatten every other point to the axis."""


def _from_zero(axes: list[list], highest: Sequence[float] | None = None) -> None:
    """Linear y axes from 0, once every panel is drawn: a shared row autoscales to all of its data only
    until a limit is set. `highest`: per row, its largest point (not bar): the top is then at most BAR_CLIP
    times it."""
    for r, row in enumerate(axes):
        row[0].set_ylim(bottom=0)
        if highest is not None and highest[r] > 0:
            row[0].set_ylim(top=min(row[0].get_ylim()[1], BAR_CLIP * highest[r]))


def _token_axis(ax, values: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_tokens(round(v))))
    ax.xaxis.set_minor_locator(NullLocator())


def _cp_axis(ax, degrees: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(degrees))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{round(v)}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("CP degree (ranks)")


def _log_values_axis(ax) -> None:
    """Log y with ticks at 1-2-5 steps and plain numbers (50, 100, 200), not powers of ten."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())


def _spread(values: Sequence[float], ranges: Sequence[tuple[float, float]]) -> list[list[float]]:
    """matplotlib's asymmetric yerr: distances from each value down to its low and up to its high."""
    pairs = list(zip(values, ranges, strict=True))
    return [[v - lo for v, (lo, _) in pairs], [hi - v for v, (_, hi) in pairs]]


def _lengths_at(sources: Sequence[Source], scenario: str, cp: int) -> list[int]:
    return _union(sources, lambda r: analysis.seq_lens(r, scenario, cp))


def _ms(result: CaseResult) -> tuple[float, float, float]:
    """The estimate, and the distances down and up to its 95% interval across rounds (with one round: the
    median over repeats and its IQR), in ms."""
    est = result.estimate
    if est is not None and est.low_s is not None and est.high_s is not None:
        return est.median_s * 1e3, (est.median_s - est.low_s) * 1e3, (est.high_s - est.median_s) * 1e3
    t = result.timing
    assert t is not None
    return t.median_s * 1e3, (t.median_s - t.q25_s) * 1e3, (t.q75_s - t.median_s) * 1e3


def _style(i: int, mode: str) -> dict:
    """Colour and marker from the mode; line style, and hollow markers growing after the first, from the
    file: a later file's point rings an earlier one's at the same place, so that one-point series of
    several files stay apart."""
    color = mode_style(mode)[0]
    return {
        "color": color,
        "linestyle": SOURCE_LINES[i % len(SOURCE_LINES)],
        "marker": mode_style(mode)[1],
        "markersize": 4.5 + 3.0 * i,
        "markerfacecolor": color if i == 0 else "none",
        "markeredgewidth": 1.0 if i == 0 else 1.3,
    }


def _all_variants(sources: Sequence[Source], scenario: str) -> list[Variant]:
    return list(dict.fromkeys(v for s in sources for v in analysis.variants(s.run, scenario)))


def _union(sources: Sequence[Source], fn: Callable[[RunResult], list]) -> list:
    return sorted({x for s in sources for x in fn(s.run)})


def _passes(sources: Sequence[Source], scenario: str) -> list[str]:
    present = {p for s in sources for p in analysis.passes(s.run, scenario)}
    return [p for p in analysis.PASSES if p in present]


TIME_NOTE = (
    "time: the estimate, geometric mean of the round medians of the rank-max elapsed time; bars: its 95% "
    "interval across rounds (one round: the median over repeats, bars its IQR)"
)


# ----------------------------------------------------------------------------------------------------------
# The charts: each returns a Figure, or the reason the results cannot support it.


def _grid(
    sources: Sequence[Source], scenario: str, keys: Sequence[int]
) -> list[list[tuple[str, int, list[Variant]]]]:
    """The panels of a chart, by row: (pass, key, the variants drawn in it), `keys` the CP degrees or lengths
    a panel is for. One file: a row per pass, a panel per key, every variant in each. Several files: small
    multiples, a row per pass and key, a panel per variant whose series are the files (no axis holds
    variants x files series)."""
    passes, variants = _passes(sources, scenario), _all_variants(sources, scenario)
    if len(sources) == 1:
        return [[(pass_, key, variants) for key in keys] for pass_ in passes]
    return [[(pass_, key, [v]) for v in variants] for pass_ in passes for key in keys]


def _panel_title(sources: Sequence[Source], shown: Sequence[Variant], text: str) -> str:
    """A panel's title: `text`, after its variant's label in small multiples."""
    return f"{shown[0].label}, {text}" if len(sources) > 1 else text


def _per_length(
    sources: Sequence[Source],
    scenario: str,
    *,
    value: Callable[[CaseResult], tuple[float, float, float]],
    ylabel: str,
    title: str,
    note: str,
    log_y: bool = True,
) -> Figure | str:
    """A value of every case vs global sequence length, log length axis (and log values, unless `log_y` is
    False: then linear from 0); `value` gives (y, distance down, distance up) of a case's bar. One file: rows
    = passes, a panel per CP degree, a series per mode. Several files: small multiples, a row per pass and CP
    degree and a panel per mode, whose series are the files (so no panel holds modes x files series)."""
    degrees = _union(sources, lambda r: analysis.cps(r, scenario))
    if max((len(_lengths_at(sources, scenario, cp)) for cp in degrees), default=0) < 2:
        return "needs at least two global sequence lengths at one CP degree"
    grid = _grid(sources, scenario, degrees)
    fig, axes = _figure(len(grid), len(grid[0]))
    for row, panels in enumerate(grid):
        for col, (pass_, cp, shown) in enumerate(panels):
            ax = axes[row][col]
            for i, s in enumerate(sources):
                for v in shown:
                    points = analysis.series(s.run, scenario, v, pass_, cp=cp)
                    if points:
                        ys = [value(r) for _, r in points]
                        xs = [n for n, _ in points]
                        ax.errorbar(
                            xs,
                            [y for y, _, _ in ys],
                            yerr=[[lo for _, lo, _ in ys], [hi for _, _, hi in ys]],
                            capsize=2,
                            **_style(i, v.mode),
                        )
                        _mark_contended(ax, xs, [y for y, _, _ in ys], [r for _, r in points])
            _token_axis(ax, _lengths_at(sources, scenario, cp))
            if log_y:
                _log_values_axis(ax)
            ax.set_title(_panel_title(sources, shown, f"{PASS_LABELS[pass_]}, CP{cp}"), fontsize=9)
            ax.set_xlabel("global sequence length (tokens)")
            if col == 0:
                ax.set_ylabel(ylabel)
            ax.grid(True, which="major", alpha=0.3)
    if not log_y:
        _from_zero(axes)
    _finish(
        fig,
        title=title,
        scenario=scenario,
        sources=sources,
        variants=_all_variants(sources, scenario),
        note=note,
    )
    return fig


def time_vs_seq(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _per_length(
        sources,
        scenario,
        value=_ms,
        ylabel="time (ms)",
        title="Time vs global sequence length",
        note=TIME_NOTE,
    )


def _tokens_per_s(result: CaseResult) -> tuple[float, float, float]:
    """Thousands of global tokens per second at the time `_ms` gives, and the distances down and up to the
    rates at the ends of its bars."""
    ms, down, up = _ms(result)
    tokens = result.case.seq_len * result.case.batch  # per ms: thousands per second
    rate = tokens / ms
    return rate, rate - tokens / (ms + up), tokens / (ms - down) - rate


def throughput_vs_seq(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _per_length(
        sources,
        scenario,
        value=_tokens_per_s,
        ylabel="thousand tokens/s (all ranks)",
        title="Throughput vs global sequence length",
        note="throughput: global tokens (sequence x batch) / the time of the pass (as the time charts: the "
        "estimate; bars from its 95% interval across rounds); higher is better",
        log_y=False,
    )


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
    ideal_line: Callable[[Any, list[int]], float] | None = None
    """Draws a panel's ideal line over its degrees, returning its highest point (kept in view)."""


def _scaling(chart: ScalingChart, sources: Sequence[Source], scenario: str) -> Figure | str:
    lengths = _union(sources, lambda r: chart.lengths(r, scenario))
    if not lengths:
        return chart.none
    grid = _grid(sources, scenario, lengths)
    fig, axes = _figure(len(grid), len(grid[0]))
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
                        highest[row] = max(highest[row], *chart.draw(ax, i, v, points))
            ordered = sorted(degrees)
            if chart.ideal_line is not None:
                highest[row] = max(highest[row], chart.ideal_line(ax, ordered))
            _cp_axis(ax, ordered)
            ax.set_title(_panel_title(sources, shown, chart.panel_text(pass_, length)), fontsize=9)
            if col == 0:
                ax.set_ylabel(chart.ylabel)
            ax.grid(True, alpha=0.3)
    _from_zero(axes, highest)
    variants = [v for v in _all_variants(sources, scenario) if v in drawn]  # the legend names what is drawn
    _finish(
        fig,
        title=chart.title,
        scenario=scenario,
        sources=sources,
        variants=variants,
        note=chart.note,
        extra=[chart.ideal],
    )
    return fig


def _draw_weak(ax: Any, i: int, v: Variant, points: list[analysis.ScalingPoint]) -> list[float]:
    cps, ms = [p.cp for p in points], [_ms(p.result) for p in points]
    times = [m for m, _, _ in ms]
    yerr = [[lo for _, lo, _ in ms], [hi for _, _, hi in ms]]
    ax.errorbar(cps, times, yerr=yerr, capsize=2, **_style(i, v.mode))
    _mark_contended(ax, cps, times, [p.result for p in points])
    # Ideal weak scaling: as many tokens per rank, as much time as on one rank.
    ax.axhline(times[0], color=mode_style(v.mode)[0], alpha=0.6, **IDEAL_FLAT)
    return times


def _draw_strong(ax: Any, i: int, v: Variant, points: list[analysis.ScalingPoint]) -> list[float]:
    cps, ratios = [p.cp for p in points], [p.ratio for p in points]
    yerr = _spread(ratios, [p.ratio_range for p in points])
    ax.errorbar(cps, ratios, yerr=yerr, capsize=2, **_style(i, v.mode))
    # a ratio is as contended as either of its two cases
    _mark_contended(ax, cps, ratios, [p.result if p.result.contended else p.base for p in points])
    for p in points:  # a speedup past the CP degree is not CP's: ringed and named where it is drawn
        if p.caveat != "implausible: above ideal":
            continue
        shown = min(p.ratio, IMPLAUSIBLE_CLIP * p.cp)  # far past ideal: at the clip, its value written
        ax.plot([p.cp], [shown], "o", ms=13, mfc="none", mec="#c62828", mew=1.5)
        label = "above ideal" if shown == p.ratio else f"above ideal: {p.ratio:.1f}x"
        ax.annotate(
            label, (p.cp, shown), xytext=(6, 6), textcoords="offset points", fontsize=7, color="#c62828"
        )
    # the axis follows what CP can do: one impossible point must not flatten the ideal line and the rest
    return [min(r, IMPLAUSIBLE_CLIP * p.cp) for r, p in zip(ratios, points, strict=True)]


IMPLAUSIBLE_CLIP = 1.25
"""A speedup above this many times its CP degree is drawn at that height, its value written beside it."""


def _speedup_equals_cp(ax: Any, degrees: list[int]) -> float:
    ax.plot(degrees, degrees, color="black", linestyle="--", linewidth=1)
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
    ideal=Line2D([], [], color="gray", alpha=0.6, label="ideal: flat at t(cp=1)", **IDEAL_FLAT),
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
    "ideal (efficiency over 100%), not CP's doing (shared cores, drift)",
    ideal=Line2D([], [], color="black", linestyle="--", label="ideal: speedup = CP degree"),
    ideal_line=_speedup_equals_cp,
)


def weak_scaling(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _scaling(WEAK, sources, scenario)


def strong_scaling(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _scaling(STRONG, sources, scenario)


DODGE = 0.04
"""Sideways nudge between neighbouring series of a chart whose series often coincide (memory: the modes
with a summary peak alike), as a fraction of the length axis (log scale: the same look at every length)."""


def _dodge(index: int, count: int) -> float:
    """The factor that moves series `index` of `count` sideways on a log axis, centred on the true value."""
    return (1 + DODGE) ** (index - (count - 1) / 2)


def _memory_points(run: RunResult, scenario: str, v: Variant, cp: int) -> list[tuple[int, float]]:
    """(global length, peak MiB) of a variant: of the first of PREFERRED_PASSES that ran (training's)."""
    out = []
    for seq_len in analysis.seq_lens(run, scenario, cp):
        for pass_ in analysis.PREFERRED_PASSES:
            r = analysis.find(run, scenario, v, cp, seq_len, pass_)
            if r is not None and r.memory is not None:
                out.append((seq_len, r.memory.peak_mib))
                break
    return out


def memory_vs_seq(sources: Sequence[Source], scenario: str) -> Figure | str:
    degrees = _union(sources, lambda r: analysis.cps(r, scenario))
    if not any(c.memory for s in sources for c in s.run.cases if c.case.scenario == scenario):
        return "no peak memory was measured"
    if max((len(_lengths_at(sources, scenario, cp)) for cp in degrees), default=0) < 2:
        return "needs at least two global sequence lengths at one CP degree"
    fig, axes = _figure(1, len(degrees))
    series = [(i, v) for i, s in enumerate(sources) for v in analysis.variants(s.run, scenario)]
    for col, cp in enumerate(degrees):
        ax = axes[0][col]
        for k, (i, v) in enumerate(series):
            points = _memory_points(sources[i].run, scenario, v, cp)
            if points:
                shift = _dodge(k, len(series))
                ax.plot([n * shift for n, _ in points], [m for _, m in points], **_style(i, v.mode))
        _token_axis(ax, _lengths_at(sources, scenario, cp))
        _log_values_axis(ax)
        ax.set_title(f"CP{cp}", fontsize=9)
        ax.set_xlabel("global sequence length (tokens)")
        if col == 0:
            ax.set_ylabel("peak allocated per rank (MiB)")
        ax.grid(True, alpha=0.3)
    meters = sorted({c.memory.meter for s in sources for c in s.run.cases if c.memory is not None})
    _finish(
        fig,
        title="Peak memory vs global sequence length",
        scenario=scenario,
        sources=sources,
        variants=_all_variants(sources, scenario),
        note="peak allocated: rank-max of one forward+backward pass (forward where only forward ran), "
        f"parameters and input included; meter {', '.join(meters)}; series are nudged sideways (a few % of "
        "the length) so that equal peaks stay visible",
        timed=False,
    )
    return fig


def _bytes_by_mode(
    sources: Sequence[Source], scenario: str, pass_: str, cp: int
) -> dict[str, dict[int, float]]:
    """mode -> {global length: MiB moved by the busiest rank}, over every source's cases (the model's
    bytes depend on the case, not on the run: equal cases of several files give one point)."""
    out: dict[str, dict[int, float]] = {}
    for s in sources:
        for v in analysis.variants(s.run, scenario):
            for n, r in analysis.series(s.run, scenario, v, pass_, cp=cp):
                out.setdefault(v.mode, {})[n] = bytes_moved(r.case) / 2**20
    return out


def comm_vs_seq(sources: Sequence[Source], scenario: str) -> Figure | str:
    degrees = [cp for cp in _union(sources, lambda r: analysis.cps(r, scenario)) if cp > 1]
    if not degrees:
        return "no case ran on more than one rank (one rank moves nothing)"
    passes = _passes(sources, scenario)
    fig, axes = _figure(len(passes), len(degrees))
    modes: list[str] = []
    for row, pass_ in enumerate(passes):
        for col, cp in enumerate(degrees):
            ax = axes[row][col]
            by_mode = _bytes_by_mode(sources, scenario, pass_, cp)
            modes += [m for m in by_mode if m not in modes]
            for k, (mode, points) in enumerate(by_mode.items()):
                lengths = sorted(points)
                shift = _dodge(k, len(by_mode))
                ax.plot([n * shift for n in lengths], [points[n] for n in lengths], **_style(0, mode))
            _token_axis(ax, _lengths_at(sources, scenario, cp))
            _log_values_axis(ax)
            ax.set_title(f"{PASS_LABELS[pass_]}, CP{cp}", fontsize=9)
            ax.set_xlabel("global sequence length (tokens)")
            if col == 0:
                ax.set_ylabel("sent + received per rank (MiB)")
            ax.grid(True, alpha=0.3)
    _finish(
        fig,
        title="Communication vs global sequence length",
        scenario=scenario,
        sources=sources[:1],
        variants=[Variant(m, None) for m in sorted(modes, key=mode_order)],
        note="bytes sent + received by the busiest rank in one pass, from gdn_cp.distributed.comm_model "
        "(equal to the bytes counted on the wire: `bench profile` checks them); one line per mode, the "
        "summary checkpoint moves no other bytes; series nudged sideways a few % so that equal lines show",
        timed=False,
    )
    return fig


def _memory_drawn(row: analysis.AblationRow) -> bool:
    """Whether the memory a switch saves at a point is drawn: measured, and at least MEMORY_RESOLUTION_MIB."""
    return row.memory_saved_mib is not None and abs(row.memory_saved_mib) >= MEMORY_RESOLUTION_MIB


def _no_effect(ax, text: str) -> None:
    """A panel that says why it has no bars (every effect within noise) instead of drawing noise."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="dimgray")
    ax.set_yticks([])


def _ablation_rows(
    sources: Sequence[Source], scenario: str, switch: analysis.Switch
) -> dict[str, list[analysis.AblationRow]]:
    """Source label -> the rows of `switch` on against off in `scenario`, from that source's run."""
    return {s.label: [r for r in analysis.ablation(s.run, switch) if r.scenario == scenario] for s in sources}


def _bar_style(mode: str, source: int, width: float) -> dict[str, Any]:
    """matplotlib bar keywords of one (source, mode) group: the mode's colour, the source's hatch."""
    return {
        "width": width,
        "color": mode_style(mode)[0],
        "hatch": SOURCE_HATCHES[source % len(SOURCE_HATCHES)],
        "edgecolor": "white" if source == 0 else "black",
        "linewidth": 0.5,
    }


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
            yerr=_spread(costs, spreads),
            capsize=2,
            error_kw={"linewidth": 0.8},
            **style,
        )
    saved = [(x, r.memory_saved_mib) for x, r in zip(xs, found, strict=True) if _memory_drawn(r)]
    ax_mem.bar([x for x, _ in saved], [m for _, m in saved], **style)


def _ablation_axes(
    ax_time: Any, ax_mem: Any, switch: analysis.Switch, points: list[tuple[int, int]], passes: set[str]
) -> None:
    """Nothing; sets both panels' titles, labels, ticks (one per (cp, length) point) and zero line."""
    labels = [f"CP{cp}\n{format_tokens(n)}" for cp, n in points]
    pass_label = " / ".join(PASS_LABELS[p] for p in analysis.PASSES if p in passes)
    for ax, title, unit in (
        (ax_time, f"time cost of {switch.on_label}, {pass_label} (above 0: slower)", "time cost (%)"),
        (
            ax_mem,
            f"peak allocated memory saved by {switch.on_label} (above 0: less memory)",
            "memory saved (MiB)",
        ),
    ):
        ax.set_xticks(range(len(points)), labels, fontsize=8)
        ax.set_xlim(-0.7, len(points) - 0.3)
        ax.tick_params(axis="x", labelbottom=True)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(unit)
        ax.grid(True, axis="y", alpha=0.3)
    ax_mem.set_xlabel("CP degree, global sequence length")


def _ablation_chart(sources: Sequence[Source], scenario: str, switch: analysis.Switch) -> Figure | str:
    """Time cost (%) and memory saved (MiB) of `switch` on against off, per point, mode and source; a panel
    whose every effect is within noise (each time interval holds 0; each memory delta below
    MEMORY_RESOLUTION_MIB) says so instead of drawing bars."""
    rows = _ablation_rows(sources, scenario, switch)
    if not any(rows.values()):
        return f"no {'/'.join(switch.modes)} case ran with {switch.on_label} both on and off"
    every = [r for rs in rows.values() for r in rs]
    time_noise = all(r.within_noise for r in every)
    memory_noise = not any(_memory_drawn(r) for r in every)
    points = sorted({(r.cp, r.seq_len) for r in every})
    modes = [m for m in switch.modes if any(r.mode == m for r in every)]
    passes = {r.pass_ for r in every}
    groups = [(i, s, m) for i, s in enumerate(sources) for m in modes]
    width_in = max(6.0, 0.28 * len(points) * len(groups) + 0.5 * len(points))
    fig = Figure(figsize=(width_in + 1.8, 6.2), layout="constrained")
    ax_time, ax_mem = fig.subplots(2, 1, sharex=True)
    width = min(0.8 / len(groups), 0.3)  # a lone point keeps slim bars
    for g, (i, s, mode) in enumerate(groups):
        by_point = {(r.cp, r.seq_len): r for r in rows[s.label] if r.mode == mode}
        xs = [x + (g - (len(groups) - 1) / 2) * width for x, p in enumerate(points) if p in by_point]
        found = [by_point[p] for p in points if p in by_point]
        if found:
            _ablation_bars(ax_time, ax_mem, found, xs, _bar_style(mode, i, width), time_noise=time_noise)
    _ablation_axes(ax_time, ax_mem, switch, points, passes)
    if time_noise:
        _no_effect(ax_time, f"no time cost told from noise: every 95% interval of {len(every)} holds 0")
    if memory_noise:
        _no_effect(ax_mem, f"no memory saved above the meter's resolution ({MEMORY_RESOLUTION_MIB} MiB)")
    _finish(
        fig,
        title=switch.title,
        scenario=scenario,
        sources=sources,
        variants=[Variant(m, True) for m in modes],
        note=f"time cost: t({switch.on_label} on) / t(off) - 1, the ratio of the round medians (bars: its "
        "95% interval across rounds, or the IQRs with one round; a bar across 0 is within noise); memory "
        f"saved: peak allocated off - on, drawn from {MEMORY_RESOLUTION_MIB} MiB (one reading a case: no "
        "interval)",
        bars=True,
    )
    return fig


def checkpoint_summary(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _ablation_chart(sources, scenario, analysis.CHECKPOINT)


def overlap_ablation(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _ablation_chart(sources, scenario, analysis.OVERLAP)


BUILDERS: dict[str, Callable[[Sequence[Source], str], Figure | str]] = {
    "time_vs_seq": time_vs_seq,
    "throughput_vs_seq": throughput_vs_seq,
    "weak_scaling": weak_scaling,
    "strong_scaling": strong_scaling,
    "memory_vs_seq": memory_vs_seq,
    "comm_vs_seq": comm_vs_seq,
    "checkpoint_summary": checkpoint_summary,
    "overlap_ablation": overlap_ablation,
}
TITLES = {
    "time_vs_seq": "Time vs global sequence length",
    "throughput_vs_seq": "Throughput (tokens/s) vs global sequence length",
    "weak_scaling": "Weak scaling",
    "strong_scaling": "Strong scaling",
    "memory_vs_seq": "Peak memory vs global sequence length",
    "comm_vs_seq": "Communication (bytes per rank) vs global sequence length",
    "checkpoint_summary": analysis.CHECKPOINT.title,
    "overlap_ablation": analysis.OVERLAP.title,
}


def machine_of(run: RunResult) -> str:
    """The machine a run was timed on, as charts tell runs apart: host, CPU, device."""
    e = run.environment
    return f"{e.hostname} ({e.cpu_model}, {e.device_type} {e.device_name})"


def by_machine(sources: Sequence[Source]) -> list[list[Source]]:
    """The sources grouped by machine, in order of first appearance."""
    groups: dict[str, list[Source]] = {}
    for s in sources:
        groups.setdefault(machine_of(s.run), []).append(s)
    return list(groups.values())


def scenario_charts(
    sources: Sequence[Source], scenario: str, *, prefixed: bool = False, force: bool = False
) -> tuple[list[Chart], list[str]]:
    """Every chart of one scenario, drawn from the sources that measured it (others would only crowd the
    legend), and one note per chart skipped. `prefixed`: names start with `<scenario>-` (several
    scenarios share a folder). Runs of different machines never share an axis: each machine gets its own
    charts (named `-machine2`, ... after the first machine's), unless `force` overlays them."""
    present = [s for s in sources if scenario in analysis.scenario_names(s.run)]
    groups = [present] if force else by_machine(present)
    prefix = f"{scenario}-" if prefixed else ""
    charts, notes = [], []
    if len(groups) > 1:
        machines = "; ".join(f"{machine_of(g[0].run)}: {', '.join(s.label for s in g)}" for g in groups)
        notes.append(f"{scenario}: charts drawn per machine ({machines}); --force overlays them")
    for k, group in enumerate(groups):
        suffix = f"-machine{k + 1}" if k else ""
        for name, build in BUILDERS.items():
            figure = build(group, scenario)
            if isinstance(figure, str):
                notes.append(f"{prefix}{name}{suffix}: skipped, {figure} in {scenario}")
            else:
                title = f"{TITLES[name]} ({scenario}{', ' + machine_of(group[0].run) if suffix else ''})"
                charts.append(Chart(name=prefix + name + suffix, title=title, figure=figure))
    return charts, notes


def build_charts(sources: Sequence[Source], *, force: bool = False) -> tuple[list[Chart], list[str]]:
    """Every chart the sources support, per scenario (and machine, unless `force`), and one note per chart
    skipped (`name: reason`)."""
    scenarios = list(dict.fromkeys(n for s in sources for n in analysis.scenario_names(s.run)))
    charts, notes = [], []
    for scenario in scenarios:
        built, skipped = scenario_charts(sources, scenario, prefixed=len(scenarios) > 1, force=force)
        charts += built
        notes += skipped
    return charts, notes
