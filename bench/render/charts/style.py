"""How a chart draws what it draws, decided once: a series' colour and marker (from its mode), its line
style and marker fill (from its file), a bar's colour, the ideal line, how a contended point is marked,
and how a point or bar past the top of its axis is marked.

Marks that the tests (and a reader of the figure object) find by their label: `_contended`, `_ideal`,
`_off_scale` (the arrow over points above the axis), `_off_scale_value` (each such point's value) and `_cut`
(a bar cut at the top); labels starting with `_` stay out of matplotlib's legends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.container import ErrorbarContainer
from matplotlib.lines import Line2D

from bench.results.store import CaseResult
from gdn_cp.distributed import MODES

MODE_STYLES: tuple[tuple[str, str], ...] = (
    ("#1f77b4", "o"),
    ("#ff7f0e", "s"),
    ("#2ca02c", "^"),
    ("#d62728", "D"),
)
"""(matplotlib colour, marker) of the registered modes, in the registry's display order (ulysses, p2p,
all_gather, scan; a test keeps one per mode). A marker per mode as well as a colour, so that lines lying on
top of each other stay visible."""
UNKNOWN_MODE_STYLE = ("gray", "o")
"""Colour and marker of a mode this bench does not know (results written by another version)."""


def mode_style(mode: str) -> tuple[str, str]:
    """(colour, marker) of `mode`."""
    return MODE_STYLES[MODES.index(mode)] if mode in MODES else UNKNOWN_MODE_STYLE


SOURCE_LINES: list[Any] = ["-", "--", "-.", (0, (6, 1.5, 1, 1.5, 1, 1.5))]
"""Line style of the 1st, 2nd, ... result file (later files also get hollow markers): solid, dashed,
dash-dot, dash-dot-dot. None is dotted: dots are the ideal's (IDEAL)."""
IDEAL: dict[str, Any] = {"linestyle": (0, (1, 3)), "linewidth": 1.3, "label": "_ideal"}
"""An ideal line (weak scaling's flat t(cp=1), strong scaling's speedup = CP degree): dots, the one dotted
style of a chart, so that no file's series reads as an ideal."""


def series_style(i: int, mode: str) -> dict:
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


def bar_style(mode: str, width: float) -> dict[str, Any]:
    """matplotlib bar keywords of one mode's bars: the mode's colour, white edges between neighbours."""
    return {"width": width, "color": mode_style(mode)[0], "edgecolor": "white", "linewidth": 0.5}


CONTENDED: dict[str, Any] = {
    "marker": "o",
    "linestyle": "none",
    "markerfacecolor": "none",
    "markeredgecolor": "black",
    "markeredgewidth": 1.2,
    "label": "_contended",
}
"""A black ring around every point timed only while the machine was shared (CaseResult.contended): a
chart never shows such a point as clean. A ring, wider than the point's own marker, never covers the
marker's face, whose colour and shape name the mode and the file."""
CONTENDED_RING_GAP = 7.0
"""How much wider (points) the ring is than the marker it surrounds."""


def mark_contended(
    ax, xs: Sequence[float], ys: Sequence[float], results: Sequence[CaseResult], markersize: float
) -> None:
    """Ring the points whose case (or, for a ratio, either case) was contended; `markersize`: the size of
    the points' own marker."""
    hits = [(x, y) for x, y, r in zip(xs, ys, results, strict=True) if r.contended]
    if hits:
        size = markersize + CONTENDED_RING_GAP
        ax.plot([x for x, _ in hits], [y for _, y in hits], markersize=size, zorder=1.9, **CONTENDED)


def contended_handle(label: str) -> Line2D:
    """The legend entry of the contended ring."""
    return Line2D([], [], **{**CONTENDED, "markersize": 10, "label": label})


OFF_SCALE_ARROW_PT = 22.0
"""Length of the arrow that points up to the top edge over an off-scale point."""
OFF_SCALE_LINE_PT = 9.0
"""Line pitch of the values written beside the arrow, one line a point (several series at one x)."""
CUT_BAR: dict[str, Any] = {
    "marker": "^",
    "markersize": 6,
    "linestyle": "none",
    "clip_on": False,
    "label": "_cut",
}
"""A hollow triangle on the top edge where a bar (an interval) is cut: the bar goes on past it."""


def drawn_points(ax) -> list[tuple[float, float, float, str]]:
    """(x, y, top of its bar, colour) of every point an `errorbar` drew on `ax` (a point without a bar:
    its top is y)."""
    out = []
    for container in ax.containers:
        if not isinstance(container, ErrorbarContainer):
            continue
        line, _caps, bars = container.lines
        tops = [max(seg[0][1], seg[1][1]) for seg in bars[0].get_segments()] if container.has_yerr else []
        ys = list(line.get_ydata())
        for k, (x, y) in enumerate(zip(line.get_xdata(), ys, strict=True)):
            out.append((float(x), float(y), float(tops[k]) if k < len(tops) else float(y), line.get_color()))
    return out


def mark_off_scale(ax, value_text: Callable[[float], str]) -> set[str]:
    """Mark, once the axis limits are final, the errorbar points above the top (an arrow up to the edge at
    their x, and beside it each point's value, `value_text(y)`, in its series' colour, on the side of the
    arrow towards the middle of the panel) and every bar cut by the top (CUT_BAR, in its series' colour).
    Returns the kinds drawn ("point", "bar") for the legend (off_scale_handles)."""
    top = ax.get_ylim()[1]
    kinds: set[str] = set()
    above: dict[float, list[tuple[float, str]]] = {}
    for x, y, bar_top, color in drawn_points(ax):
        if y > top:
            above.setdefault(x, []).append((y, color))
        elif bar_top > top:
            ax.plot([x], [1.0], transform=ax.get_xaxis_transform(), color=color, mfc="none", **CUT_BAR)
            kinds.add("bar")
    for x, points in above.items():
        colors = {color for _, color in points}
        arrow = colors.pop() if len(colors) == 1 else "dimgray"
        ax.annotate(
            "",
            xy=(x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -OFF_SCALE_ARROW_PT),
            textcoords="offset points",
            arrowprops={"arrowstyle": "-|>", "color": arrow, "lw": 1.2, "shrinkA": 0, "shrinkB": 0},
            label="_off_scale",
        )
        # the value beside the arrow, towards the panel's middle (an arrow at the right edge: on its left)
        right_half = ax.transAxes.inverted().transform(ax.transData.transform((x, top)))[0] > 0.5
        for k, (y, color) in enumerate(sorted(points, reverse=True)):
            ax.annotate(
                value_text(y),
                xy=(x, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-4 if right_half else 4, -2 - OFF_SCALE_LINE_PT * k),
                textcoords="offset points",
                ha="right" if right_half else "left",
                va="top",
                fontsize=7.5,
                color=color,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.6},
                label="_off_scale_value",
            )
        kinds.add("point")
    return kinds


def off_scale_handles(kinds: set[str]) -> list[Line2D]:
    """Legend entries of the off-scale marks drawn (mark_off_scale's kinds)."""
    out = []
    if "point" in kinds:
        out.append(
            Line2D(
                [],
                [],
                color="dimgray",
                marker="$\\uparrow$",
                linestyle="none",
                label="above the axis (value beside)",
            )
        )
    if "bar" in kinds:
        out.append(
            Line2D([], [], mfc="none", mec="dimgray", **{**CUT_BAR, "label": "interval cut at the top"})
        )
    return out
