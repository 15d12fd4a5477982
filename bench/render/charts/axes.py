"""The panels of a chart and their axes: the grid (a row per pass, small multiples for several files), the
length, CP-degree and log value axes, linear axes from 0 with long bars cut, and the sideways nudge that
keeps coinciding series apart."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

from bench.formats import format_tokens
from bench.judge.analysis import Variant
from bench.render.charts.sources import Source, all_variants, passes
from bench.render.charts.style import drawn_points, mark_off_scale

PANEL_SIZE = (3.6, 2.9)
"""Inches per panel, where the figure has room (MAX_FIGURE_WIDTH_IN)."""
MAX_FIGURE_WIDTH_IN = 12.5
"""The widest figure, in inches: the HTML report's page (bench.render.document, 1200 px less its margins)
shows it, saved with its tight box (about 0.3 in more), at 90 px an inch or more, so that its 8-pt text
(legend, footnote) reads at 10 px. Panels narrow to fit it (down to MIN_PANEL_WIDTH_IN)."""
MIN_PANEL_WIDTH_IN = 2.4
LEGEND_WIDTH_IN = 1.8
"""Room for the legend, outside the panels on the right."""


def panel_figure(rows: int, cols: int) -> tuple[Figure, list[list]]:
    """A grid of panels; panels of a row share their y axis, so that they compare at a glance. As many
    columns as fit MAX_FIGURE_WIDTH_IN at full size; more narrow their panels."""
    room = (MAX_FIGURE_WIDTH_IN - LEGEND_WIDTH_IN) / cols
    width = max(MIN_PANEL_WIDTH_IN, min(PANEL_SIZE[0], room))
    fig = Figure(figsize=(width * cols + LEGEND_WIDTH_IN, PANEL_SIZE[1] * rows + 1.0), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey="row")
    return fig, [list(r) for r in axes]


def panel_grid(
    sources: Sequence[Source], scenario: str, keys: Sequence[int]
) -> list[list[tuple[str, int, list[Variant]]]]:
    """The panels of a chart, by row: (pass, key, the variants drawn in it), `keys` the CP degrees or lengths
    a panel is for. One file: a row per pass, a panel per key, every variant in each. Several files: small
    multiples, a row per pass and key, a panel per variant whose series are the files (no axis holds
    variants x files series)."""
    passes_, variants = passes(sources, scenario), all_variants(sources, scenario)
    if len(sources) == 1:
        return [[(pass_, key, variants) for key in keys] for pass_ in passes_]
    return [[(pass_, key, [v]) for v in variants] for pass_ in passes_ for key in keys]


TITLE_CHARS_PER_INCH = 10
"""Characters of a panel's 9-pt title per inch of panel width (DejaVu Sans: about 0.55 of the size each)."""


def panel_title(sources: Sequence[Source], shown: Sequence[Variant], text: str, ax) -> str:
    """A panel's title: `text`, after its variant's label in small multiples (on a line of its own where
    both do not fit the width of the panel `ax`)."""
    if len(sources) == 1:
        return text
    title = f"{shown[0].label}, {text}"
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    return title if len(title) <= width_in * TITLE_CHARS_PER_INCH else f"{shown[0].label},\n{text}"


BAR_CLIP = 1.6
"""An interval reaching past this many times a row's largest point is cut at the panel's top: one wide
interval (a case of few or noisy rounds) must not flatten every other point to the axis."""
TOP_MARGIN = 1.06
"""Room above the highest thing kept in view."""


def from_zero(
    axes: list[list],
    highest: Sequence[float] | None = None,
    value_text: Callable[[float], str] = "{:.3g}".format,
) -> set[str]:
    """Linear y axes from 0, once every panel is drawn (a shared row autoscales to all of its data only
    until a limit is set), their tops from the data: `highest`, per row, its largest point kept in view (by
    default the largest errorbar point), and every point and bar end up to BAR_CLIP times it. A bar reaching
    past is cut at the top, a point past it (strong scaling's impossible speedups) drawn off-scale: both
    marked (style.mark_off_scale, the point's value as `value_text` writes it). Returns the kinds of marks
    drawn, for the legend."""
    kinds: set[str] = set()
    for r, row in enumerate(axes):
        row[0].set_ylim(bottom=0)
        drawn = [p for ax in row for p in drawn_points(ax)]
        high = highest[r] if highest is not None else max((y for _, y, _, _ in drawn), default=0.0)
        if high <= 0:
            continue
        cap = BAR_CLIP * high
        kept = [v for _, y, bar_top, _ in drawn for v in (y, bar_top) if v <= cap]
        row[0].set_ylim(top=TOP_MARGIN * max([high, *kept]))
        for ax in row:
            kinds |= mark_off_scale(ax, value_text)
    return kinds


def token_axis(ax, values: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_tokens(round(v))))
    ax.xaxis.set_minor_locator(NullLocator())


def cp_axis(ax, degrees: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(degrees))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{round(v)}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("CP degree (ranks)")


def log_values_axis(ax) -> None:
    """Log y with ticks at 1-2-5 steps and plain numbers (50, 100, 200), not powers of ten."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())


def spread(values: Sequence[float], ranges: Sequence[tuple[float, float]]) -> list[list[float]]:
    """matplotlib's asymmetric yerr: distances from each value down to its low and up to its high."""
    # never below 0: a range from one repeat (q25 = q75) can miss its value by a rounding (exp(log(t)) != t)
    pairs = list(zip(values, ranges, strict=True))
    return [[max(0.0, v - lo) for v, (lo, _) in pairs], [max(0.0, hi - v) for v, (_, hi) in pairs]]


DODGE = 0.04
"""Sideways nudge between neighbouring series of a chart whose series often coincide (memory: the modes
with a summary peak alike), as a fraction of the length axis (log scale: the same look at every length)."""


def dodge(index: int, count: int) -> float:
    """The factor that moves series `index` of `count` sideways on a log axis, centred on the true value."""
    return (1 + DODGE) ** (index - (count - 1) / 2)
