"""Issue 46's charts, read from the figure objects (axes limits and artists), not from pixels: nothing
off-scale unmarked, a contended point ringed rather than covered, one series a file in an overlay's panel,
the ideal the only dotted line, a title naming every file drawn, a "no effect" panel not struck through,
every figure as wide as the report shows readably, and each builder drawing only what its run measured."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from bench.judge import analysis
from bench.measure.statistics import estimate
from bench.measure.timing import summarize
from bench.render.charts import BUILDERS, Chart, mode_style, sources_for, strong_scaling, time_vs_seq
from bench.render.charts.axes import MAX_FIGURE_WIDTH_IN
from bench.render.charts.style import MODE_STYLES
from bench.results.store import CaseResult, MemoryResult, RoundResult, RunResult, load_result
from tests.bench.commands.test_compare import case, ok, run_of
from tests.bench.render.test_views import _contended, _scaling_run

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _commit(run: RunResult, n: int) -> RunResult:
    """`run` as measured at another commit (so that overlays tell the files apart)."""
    return dataclasses.replace(run, environment=dataclasses.replace(run.environment, git_commit=f"{n}" * 40))


def _overlay(files: int) -> list:
    """The scaling fixture at `files` commits, as the sources of one chart."""
    run = load_result(FIXTURES / "scaling.json")
    return sources_for([_commit(run, n + 1) for n in range(files)])


def _errorbar_points(ax) -> list[tuple[float, float, float]]:
    """(x, y, top of its bar) of every errorbar point of `ax`."""
    out = []
    for container in ax.containers:
        if container.__class__.__name__ != "ErrorbarContainer":
            continue
        line, _, bars = container.lines
        tops = [max(s[0][1], s[1][1]) for s in bars[0].get_segments()] if container.has_yerr else []
        for k, (x, y) in enumerate(zip(line.get_xdata(), line.get_ydata(), strict=True)):
            out.append((float(x), float(y), float(tops[k]) if tops else float(y)))
    return out


def _marked_at(ax, label: str) -> set[float]:
    """The x positions of `ax`'s marks labelled `label` (annotations and lines)."""
    xs = {float(t.xy[0]) for t in ax.texts if t.get_label() == label}
    return xs | {float(x) for line in ax.get_lines() if line.get_label() == label for x in line.get_xdata()}


def _unmarked_off_scale(fig: Figure) -> list[tuple[str, float, float]]:
    """Points above their axis without an off-scale arrow, and bars reaching past it without a cut mark."""
    out = []
    for ax in fig.axes:
        top = ax.get_ylim()[1]
        arrows, cuts = _marked_at(ax, "_off_scale"), _marked_at(ax, "_cut")
        for x, y, bar_top in _errorbar_points(ax):
            if y > top and x not in arrows:
                out.append(("point", x, y))
            elif y <= top < bar_top and x not in cuts:
                out.append(("bar", x, bar_top))
    return out


def test_an_impossible_speedup_is_drawn_off_scale_with_its_value():
    """Issue 46: strong scaling's axis stopped at 0-4 and the cp 2 points left it unmarked. 30x on 2 ranks
    keeps the axis at the ideal's height, and an arrow at the top says where the point went and its value."""
    figure = strong_scaling(sources_for([_scaling_run(3.3)]), "synthetic")
    (ax,) = figure.axes
    assert ax.get_ylim()[1] < 3  # the ideal (2) and the cp=1 point set it, not the 30x point
    (y,) = [y for x, y, _ in _errorbar_points(ax) if x == 2]
    assert y > ax.get_ylim()[1] and _marked_at(ax, "_off_scale") == {2.0}
    assert [t.get_text() for t in ax.texts if t.get_label() == "_off_scale_value"] == ["30.3x"]
    assert _unmarked_off_scale(figure) == []


def _in_rounds(c, round_medians: list[float]) -> CaseResult:
    """An ok case whose rounds (one repeat each) took `round_medians` seconds."""
    rounds = [RoundResult(samples_s=[[s]] * c.cp) for s in round_medians]
    return CaseResult(
        case=c,
        status="ok",
        rounds=rounds,
        estimate=estimate(round_medians),
        timing=summarize([list(round_medians)] * c.cp),
        threads_per_rank=1,
    )


def test_an_interval_cut_at_the_top_is_marked():
    """One wide interval (a case of few, scattered rounds) is cut at the panel's top, so that it does not
    flatten the other points, and a mark on the top edge says the bar goes on."""
    at = [dataclasses.replace(case("p2p", n), cp=cp) for n in (128, 256) for cp in (1, 2)]
    run = run_of(
        _in_rounds(at[0], [0.100, 0.101, 0.099]),
        _in_rounds(at[1], [0.060, 0.061, 0.250]),  # rounds far apart: a wide interval
        _in_rounds(at[2], [0.200, 0.201, 0.199]),
        _in_rounds(at[3], [0.110, 0.111, 0.109]),
    )
    figure = BUILDERS["throughput_vs_seq"](sources_for([run]), "synthetic")
    cut = [(ax, x) for ax in figure.axes for x, y, top in _errorbar_points(ax) if top > ax.get_ylim()[1]]
    assert cut, "the fixture's wide interval should reach past the top"
    assert _unmarked_off_scale(figure) == []
    assert any(h.get_label() == "interval cut at the top" for h in figure.legends[0].legend_handles)


@pytest.mark.parametrize("name", ["time_vs_seq", "throughput_vs_seq", "strong_scaling", "weak_scaling"])
def test_no_chart_of_the_fixtures_leaves_a_point_or_bar_off_scale_unmarked(name):
    for sources in (_overlay(1), _overlay(3)):
        figure = BUILDERS[name](sources, "tiny-scaling")
        assert _unmarked_off_scale(figure) == [], name


def test_a_contended_point_is_ringed_around_its_marker_not_covered():
    """Issue 46: a black cross over the mode-coloured marker hid which mode it was. The contended mark is
    a ring with no face, wider than the marker it surrounds, so the marker shows through whole."""
    run = run_of(
        _contended(ok(case("p2p", 64), 100, seed=1)),
        ok(case("ulysses", 64), 80, seed=2),
        ok(case("p2p", 128), 190, seed=3),
        ok(case("ulysses", 128), 150, seed=4),
    )
    figure = time_vs_seq(sources_for([run]), "synthetic")
    (ax,) = figure.axes
    rings = [line for line in ax.get_lines() if line.get_label() == "_contended"]
    assert len(rings) == 1 and list(rings[0].get_xdata()) == [64]
    ring = rings[0]
    point = next(c.lines[0] for c in ax.containers if c.lines[0].get_color() == mode_style("p2p")[0])
    assert ring.get_marker() == "o" and ring.get_markerfacecolor() == "none"
    # the ring's inner edge lies outside the marker's outer edge
    inner = ring.get_markersize() - ring.get_markeredgewidth()
    assert inner > point.get_markersize() + point.get_markeredgewidth()
    assert ring.get_zorder() < point.get_zorder()  # and under it, should the two ever touch


def test_a_three_file_memory_overlay_holds_one_series_a_file_per_panel():
    """Issue 46: 12 series in one panel. Several files: a panel per CP degree and mode, whose series are
    the files (at most one a file), each panel one mode's colour."""
    figure = BUILDERS["memory_vs_seq"](_overlay(3), "tiny-scaling")
    run = load_result(FIXTURES / "scaling.json")
    variants = analysis.variants(run, "tiny-scaling")
    assert len(figure.axes) == len(analysis.cps(run, "tiny-scaling")) * len(variants)
    for ax in figure.axes:
        series = [line for line in ax.get_lines() if len(line.get_xdata())]
        assert 1 <= len(series) <= 3
        assert len({line.get_color() for line in series}) == 1


def _dotted(line: Line2D) -> bool:
    """Whether a line is drawn in dots: every dash of its pattern no longer than its width."""
    _, dashes = line._unscaled_dash_pattern
    return dashes is not None and all(on <= 1.0 for on in dashes[::2])


@pytest.mark.parametrize("name", ["weak_scaling", "strong_scaling"])
def test_the_ideal_is_the_only_dotted_line(name):
    """Issue 46: a third file's dotted series read as weak scaling's dotted ideal; strong scaling's dashed
    ideal was the second file's style. Four files: the ideal lines are dotted, and no series is."""
    figure = BUILDERS[name](_overlay(4), "tiny-scaling")
    ideals = [line for ax in figure.axes for line in ax.get_lines() if line.get_label() == "_ideal"]
    series = [c.lines[0] for ax in figure.axes for c in ax.containers if hasattr(c, "has_yerr")]
    assert ideals and len({line.get_markersize() for line in series}) == 4  # every file drawn
    assert all(_dotted(line) for line in ideals)
    assert not any(_dotted(line) for line in series)
    handles = [h for h in figure.legends[0].legend_handles if isinstance(h, Line2D)]
    assert [h.get_label() for h in handles if _dotted(h)] == [
        h.get_label() for h in handles if "ideal" in h.get_label()
    ]


def test_the_communication_title_names_every_file_it_draws():
    """Issue 46: the title named one run while the chart drew a scan series only another run measured.
    Bytes are the model's: one series a mode over every file, and every file named."""
    run = load_result(FIXTURES / "scaling.json")
    first = _commit(dataclasses.replace(run, cases=[c for c in run.cases if c.case.mode != "p2p"]), 1)
    second = _commit(run, 2)
    sources = sources_for([first, second])
    figure = BUILDERS["comm_vs_seq"](sources, "tiny-scaling")
    title = figure.get_suptitle()
    assert all(s.label in title for s in sources), title
    entries = [t.get_text() for t in figure.legends[0].get_texts()]
    assert not any(s.label in e for s in sources for e in entries)  # no line style stands for a file


def _equal_memory(run: RunResult) -> RunResult:
    """`run` with every case's peak memory the same: no switch saves any."""
    peak = 10 * 2**20
    memory = MemoryResult(peak_bytes=peak, per_rank_bytes=[peak], baseline_bytes=[0], meter="test")
    return dataclasses.replace(
        run, cases=[dataclasses.replace(c, memory=memory) if c.memory else c for c in run.cases]
    )


def test_a_panel_without_effects_says_so_with_no_line_through_its_text():
    """Issue 46: "no memory saved above the meter's resolution" was struck through by the zero line."""
    run = _equal_memory(load_result(FIXTURES / "scaling.json"))
    figure = BUILDERS["checkpoint_summary"](sources_for([run]), "tiny-scaling")
    (empty,) = [ax for ax in figure.axes if any("no memory saved" in t.get_text() for t in ax.texts)]
    assert empty.get_lines() == [] and not any(line.get_visible() for line in empty.get_ygridlines())


def test_the_ablation_of_one_repeat_cases_draws():
    """results/20261204-cpu-memory-8k.json (one repeat a case) stopped `bench plot` with "'yerr' must not
    contain negative values": the cost, from exp(log(t)), missed its one-repeat range (t itself) by a
    rounding. The times are that file's."""
    times = {"p2p": (21.63495822599998, 22.613237116000164), "scan": (21.746596016999774, 22.806656361000023)}
    results = []
    for mode, (off, on) in times.items():
        base = dataclasses.replace(case(mode, 64), pass_="forward_backward")
        results += [
            _in_rounds(dataclasses.replace(base, checkpoint=False), [off]),
            _in_rounds(base, [on]),
        ]
    run = run_of(*results)
    rows = analysis.ablation(run, analysis.CHECKPOINT)
    assert any(not lo <= r.time_cost_pct <= hi for r in rows for lo, hi in [r.time_cost_range_pct])
    figure = BUILDERS["checkpoint_summary"](sources_for([run]), "synthetic")
    assert isinstance(figure, Figure), figure


def test_every_chart_of_a_three_file_overlay_is_as_wide_as_the_report_reads():
    """Issue 46: the report scales a chart to its page, so a 24-inch figure's text read at 5 px. Three
    files of the four modes: every figure is at most MAX_FIGURE_WIDTH_IN wide, saved as well as drawn."""
    modes = ("ulysses", "p2p", "all_gather", "scan")
    cases = [
        ok(case(m, n), n / 2, seed=k) for k, (m, n) in enumerate((m, n) for m in modes for n in (64, 128))
    ]
    sources = sources_for([_commit(run_of(*cases), n) for n in (1, 2, 3)])
    drawn = 0
    for name, build in BUILDERS.items():
        figure = build(sources, "synthetic")
        if isinstance(figure, str):
            continue
        drawn += 1
        assert figure.get_figwidth() <= MAX_FIGURE_WIDTH_IN, name
        png = Chart(name=name, title=name, figure=figure, dpi=40).png_bytes()
        width_px = int.from_bytes(png[16:20], "big")  # the PNG's IHDR width
        assert width_px / 40 <= MAX_FIGURE_WIDTH_IN + 0.5, (name, width_px / 40)
    assert drawn >= 4


def _modes_of_colours(colours: set) -> set[str]:
    by_colour = {
        c: m for (c, _), m in zip(MODE_STYLES, ("ulysses", "p2p", "all_gather", "scan"), strict=True)
    }
    return {by_colour[c] for c in colours if c in by_colour}


def _drawn_modes(figure: Figure) -> set[str]:
    """The modes a figure draws a series or a bar of, by their colour."""
    colours = set()
    for ax in figure.axes:
        colours |= {
            line.get_color() for line in ax.get_lines() if line.get_marker() not in ("None", "", None)
        }
        for container in ax.containers:
            if isinstance(container, BarContainer):
                colours |= {_hex(p.get_facecolor()) for p in container.patches}
    return _modes_of_colours(colours)


def _hex(rgba) -> str:
    return "#" + "".join(f"{round(v * 255):02x}" for v in rgba[:3])


@pytest.mark.parametrize("name", list(BUILDERS))
def test_each_builder_draws_only_the_series_its_runs_measured(name):
    run = load_result(FIXTURES / "scaling.json")
    for measured in ({"ulysses", "p2p"}, {"p2p"}):
        one = dataclasses.replace(run, cases=[c for c in run.cases if c.case.mode in measured])
        figure = BUILDERS[name](sources_for([one]), "tiny-scaling")
        if isinstance(figure, str):
            continue
        assert _drawn_modes(figure) <= measured, (name, _drawn_modes(figure))
        assert _drawn_modes(figure), name


def test_an_overlay_draws_a_files_series_only_where_it_measured_the_mode():
    """Small multiples: the panel of a mode holds the series of the files that measured it, no more."""
    run = load_result(FIXTURES / "scaling.json")
    without = _commit(dataclasses.replace(run, cases=[c for c in run.cases if c.case.mode != "ulysses"]), 2)
    for name in ("time_vs_seq", "weak_scaling", "strong_scaling", "memory_vs_seq"):
        figure = BUILDERS[name](sources_for([_commit(run, 1), without]), "tiny-scaling")
        for ax in figure.axes:
            colour, marker = mode_style("ulysses")
            sizes = {
                line.get_markersize()
                for line in ax.get_lines()
                if line.get_color() == colour and line.get_marker() == marker  # not caps, rings or marks
            }
            assert sizes <= {4.5}, (name, ax.get_title())  # the second file's markers are 7.5
