"""Issue 46's history site chart (bench.render.charts.history), read from the figure: a slot only for the
runs whose file has the case, the legend beside the panels, commit labels readable at the page's size, and
one huge interval cut at the top and marked instead of flattening every point."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.commands.history import load_history
from bench.measure.statistics import estimate
from bench.render.charts.axes import BAR_CLIP, TOP_MARGIN
from bench.render.charts.history import history_chart
from bench.results.store import CaseResult, save_result
from tests.bench.commands.test_compare import case, environment, ok, run_of
from tests.bench.render.test_views import _contended

COMMITS = 5
"""Commits 0-4: p2p appears at commit 2, commit 3 ran on a shared machine, commit 4's rounds scatter."""


def _scattered(result: CaseResult) -> CaseResult:
    """`result` with its last round 20x the others: a 95% interval reaching into seconds."""
    *kept, last = result.rounds
    far = dataclasses.replace(last, samples_s=[[x * 20 for x in rank] for rank in last.samples_s])
    rounds = [*kept, far]
    return dataclasses.replace(result, rounds=rounds, estimate=estimate([r.median_s for r in rounds]))


def _history(tmp_path: Path):
    for i in range(COMMITS):
        env = environment(git_commit=f"{i}" * 40, git_date=f"2026-11-0{i + 1}T10:00:00+00:00")
        results = [ok(case("ulysses", 64), 22, seed=10 * i)]
        if i >= 2:
            p2p = ok(case("p2p", 64), 30, seed=10 * i + 1)
            results.append(_scattered(p2p) if i == 4 else p2p)
        if i == 3:
            results = [_contended(r) for r in results]
        save_result(run_of(*results, env=env), tmp_path / f"{i}.json")
    (history,) = load_history([tmp_path])
    return history, {c.key.split("/")[1]: c for c in history.cases}


def test_a_case_has_a_slot_only_for_the_runs_that_have_it(tmp_path: Path):
    history, cases = _history(tmp_path)
    figure = history_chart(history, cases["p2p-ckpt-cp2-T64-fwd"]).figure
    labels = [t.get_text() for t in figure.axes[1].get_xticklabels()]
    assert labels == [f"{i}" * 8 for i in (2, 3, 4)]  # commits 0 and 1 had no p2p: no empty slots
    every = history_chart(history, cases["ulysses-cp2-T64-fwd"]).figure
    assert len(every.axes[1].get_xticks()) == COMMITS


def test_the_legend_sits_beside_the_panels_not_on_a_point(tmp_path: Path):
    history, cases = _history(tmp_path)
    figure = history_chart(history, cases["ulysses-cp2-T64-fwd"]).figure
    assert all(ax.get_legend() is None for ax in figure.axes)
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["contended"]
    rings = [line for line in figure.axes[0].get_lines() if line.get_label() == "_contended"]
    assert [list(line.get_xdata()) for line in rings] == [[3]]


def test_commit_labels_read_at_ten_pixels_or_more(tmp_path: Path):
    """The page shows the chart at its own size (CHART_DPI): 7-pt labels at 80 dpi read at 7.8 px."""
    history, cases = _history(tmp_path)
    chart = history_chart(history, cases["ulysses-cp2-T64-fwd"])
    for label in chart.figure.axes[1].get_xticklabels():
        assert label.get_fontsize() * chart.dpi / 72 >= 10


def test_one_huge_interval_is_cut_and_marked_instead_of_flattening_the_points(tmp_path: Path):
    """Issue 46: a 13.5 s whisker flattened a 22 ms point to zero. The axis reaches the points (and the
    bars within BAR_CLIP of the highest); the interval past it is cut at the top, a mark where it is."""
    history, cases = _history(tmp_path)
    p2p = cases["p2p-ckpt-cp2-T64-fwd"]
    est = p2p.results[4].estimate
    assert est.high_s / est.median_s > 5 * BAR_CLIP  # the fixture's interval: far past the points
    ax = history_chart(history, p2p).figure.axes[0]
    times = [r.estimate.median_s * 1e3 for r in p2p.results if r is not None]
    assert ax.get_ylim()[1] <= TOP_MARGIN * BAR_CLIP * max(times)
    assert min(times) > 0.15 * ax.get_ylim()[1]  # the smallest point stands clear of the axis
    cuts = [line for line in ax.get_lines() if line.get_label() == "_cut"]
    assert [list(line.get_xdata()) for line in cuts] == [[2]]  # commit 4, the case's third slot
