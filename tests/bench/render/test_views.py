"""Issue 37: every view of a result takes the one time and the same flags from bench.formats, so
that a case reads the same in bench show, compare, report, gate, history and export, and a contended case
is said to be so in each of them."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

from rich.console import Console

from bench.commands import history as history_command
from bench.commands.history import load_history
from bench.formats import format_time
from bench.judge import analysis
from bench.judge.comparison import compare_runs
from bench.judge.gate import gate
from bench.measure.contention import Contention
from bench.render import run_tables
from bench.render.charts import sources_for, strong_scaling, time_vs_seq
from bench.render.comparison import render_markdown, render_table
from bench.render.document import MarkdownCharts, Table
from bench.render.document import render_markdown as document_markdown
from bench.render.gate import timing_table
from bench.render.history import scenario_page
from bench.render.report import _side_by_side, build_report
from bench.render.report_run import report_runs
from bench.results.export import export_rows
from bench.results.store import CaseResult, RunResult, save_result
from tests.bench.commands.test_compare import case, environment, ok, run_of


def _spread_run() -> RunResult:
    """Three cases whose round medians scatter widely: the pooled median over every repeat is not the
    estimate (the geometric mean of the round medians), the pair the issue found printed both."""
    return run_of(
        ok(case("p2p", 64), 100, spread=0.3, seed=11, rounds=4),
        ok(case("ulysses", 64), 80, spread=0.3, seed=12, rounds=4),
        ok(case("p2p", 128), 190, spread=0.3, seed=13, rounds=4),
    )


def _contended(result: CaseResult) -> CaseResult:
    shared = Contention(0.6, 0.0, 1.0, 2.0, True)
    rounds = [dataclasses.replace(r, contention=shared) for r in result.rounds]
    return dataclasses.replace(result, rounds=rounds, contention=shared)


def _text(render) -> str:
    console = Console(width=250, record=True, file=io.StringIO())
    render(console)
    return console.export_text()


def _views(base: RunResult, head: RunResult, tmp_path: Path) -> dict[str, str]:
    """Each view's text of head (against base where the view compares)."""
    comparison = compare_runs(base, head)
    labels = ("base.json", "head.json")
    title, sections = build_report(report_runs([base, head], [Path("base.json"), Path("head.json")]))
    files = []
    for i, run in enumerate((base, head)):
        commit = f"{i + 1}" * 40
        dated = dataclasses.replace(run, environment=dataclasses.replace(run.environment, git_commit=commit))
        save_result(dated, tmp_path / f"{commit[:12]}.json")
        files.append(tmp_path / f"{commit[:12]}.json")
    (history,) = load_history(files)
    gate_rows = timing_table(gate(comparison, [], [])).rows
    return {
        "show": _text(lambda c: run_tables.render(head, c)),
        "show markdown": run_tables.markdown(head),
        "compare": _text(lambda c: render_table(comparison, labels, c)),
        "compare markdown": render_markdown(comparison, labels),
        "report": document_markdown(
            title, sections, MarkdownCharts(folder=tmp_path / "c", relative_to=tmp_path)
        ),
        "gate": "\n".join(" | ".join(row) for row in gate_rows),
        "history site": scenario_page(history),
        "history table": _text(
            lambda c: history_command.run([str(f) for f in files], fmt="table", console=c)
        ),
    }


def test_every_view_prints_a_case_at_the_same_time(tmp_path: Path):
    base, head = _spread_run(), _spread_run()
    for result in head.cases:
        assert result.timing is not None and result.estimate is not None
        assert abs(result.timing.median_s / result.estimate.median_s - 1) > 1e-3  # they differ
    views = _views(base, head, tmp_path)
    for result in head.cases:
        shown = format_time(result)
        assert shown.startswith(f"{result.estimate.median_s * 1e3:.3f} ms")  # the estimate
        for name, text in views.items():
            if name != "history table":  # it lists changes, not times
                assert shown in text, (name, shown)
    rows = {r["case_id"]: r for r in export_rows(head)}
    for result in head.cases:  # export's time column is the same estimate, as a number
        assert rows[result.case.case_id]["estimate_s"] == result.estimate.median_s


def test_every_view_says_a_contended_case_is_contended(tmp_path: Path):
    base = _spread_run()
    head = dataclasses.replace(base, cases=[_contended(c) for c in base.cases])
    head = dataclasses.replace(head, environment=environment(git_commit="c" * 40))
    for name, text in _views(base, head, tmp_path).items():
        assert "contended" in text.lower(), name
    rows = export_rows(head)
    assert all(r["contended"] is True for r in rows)


def _scaling_run(cp2_ms: float, *, contended: bool = False) -> RunResult:
    one = ok(dataclasses.replace(case("p2p", 128), cp=1), 100, seed=21)
    two = ok(case("p2p", 128), cp2_ms, seed=22)
    return run_of(one, _contended(two) if contended else two)


def _cp2_point(run: RunResult) -> analysis.ScalingPoint:
    (variant,) = analysis.variants(run, "synthetic")
    points = analysis.strong_scaling(run, "synthetic", variant, "forward", seq_len=128)
    return next(p for p in points if p.cp == 2)


def test_scaling_above_ideal_or_from_a_contended_side_is_flagged(tmp_path: Path):
    """Issue 37: CP2 over CP1 read `30.41x (1520%)` with no caveat on a 2-core machine. Above ideal the
    report's cell says so and the chart rings the point; from a contended side no efficiency is given."""
    impossible = _scaling_run(3.3)  # 30x on 2 ranks
    point = _cp2_point(impossible)
    assert point.efficiency > 1 and point.caveat == "implausible: above ideal"
    title, sections = build_report(report_runs([impossible], [Path("run.json")]))
    report = document_markdown(title, sections, MarkdownCharts(folder=tmp_path / "c", relative_to=tmp_path))
    assert "(implausible: above ideal)" in report
    figure = strong_scaling(sources_for([impossible]), "synthetic")
    # far past ideal: drawn off-scale, an arrow at the top and its value (issue 46)
    assert any(t.get_text() == "30.3x" for ax in figure.axes for t in ax.texts)
    assert max(ax.get_ylim()[1] for ax in figure.axes) < 5  # 30x does not stretch the axis past ideal
    assert _cp2_point(_scaling_run(60.0)).caveat is None  # 1.67x on 2 ranks: 83%, nothing to say
    shared = _scaling_run(60.0, contended=True)
    assert _cp2_point(shared).caveat == "contended"
    title, sections = build_report(report_runs([shared], [Path("run.json")]))
    report = document_markdown(title, sections, MarkdownCharts(folder=tmp_path / "d", relative_to=tmp_path))
    assert "- (contended)" in report and "(83%)" not in report  # no efficiency from a contended side


def test_a_few_shared_rounds_are_not_called_contended_cases():
    """The committed baseline's report read "CONTENDED: 0 of 140 cases contended ... 7 of 700 rounds": a
    contradiction. A run whose cases each have clean rounds says how many rounds were shared, and no more."""
    run = _spread_run()
    first = run.cases[0]
    shared = Contention(0.6, 0.0, 1.0, 2.0, True)
    rounds = [dataclasses.replace(first.rounds[0], contention=shared), *first.rounds[1:]]
    run.cases[0] = dataclasses.replace(first, rounds=rounds)
    text = _text(lambda c: run_tables.render(run, c))
    assert "shared rounds: 1 of 12 rounds were timed while the machine was shared" in " ".join(text.split())
    assert "cases contended" not in text
    assert run_tables.markdown(run).count("SHARED ROUNDS: 1 of 12 rounds") == 1


def test_tables_follow_scenario_order_not_the_order_cases_ran():
    """Issue 37: rows of show's throughput table, the report's side-by-side table and `bench model check`
    came in the shuffled execution order. Cases that ran p2p-128, ulysses-64, p2p-64 read by sequence
    length, then mode in the registry's order."""
    shuffled = run_of(
        ok(case("p2p", 128), 190, seed=31),
        ok(case("ulysses", 64), 80, seed=32),
        ok(case("p2p", 64), 100, seed=33),
    )
    wanted = ["ulysses-cp2-T64-fwd", "p2p-ckpt-cp2-T64-fwd", "p2p-ckpt-cp2-T128-fwd"]
    assert [c.key.split("/")[1] for c in compare_runs(shuffled, shuffled).cases] == wanted
    blocks = _side_by_side(report_runs([shuffled, shuffled], [Path("a.json"), Path("b.json")]), "synthetic")
    (table,) = [b for b in blocks if isinstance(b, Table)]
    assert [row[0] for row in table.rows] == wanted


def test_an_incomplete_run_is_said_to_be_in_every_view(tmp_path: Path):
    """A run stopped after 2 of 4 rounds: show, the report, the history site and the charts' footnote say
    so, and export's rows carry the flag."""
    short = dataclasses.replace(case("p2p", 64), rounds=4)
    run = run_of(ok(short, 100, seed=41, rounds=2))
    assert "incomplete: 1 of 1 cases incomplete: 2 of 4 rounds" in " ".join(
        _text(lambda c: run_tables.render(run, c)).split()
    )
    title, sections = build_report(report_runs([run], [Path("run.json")]))
    report = document_markdown(title, sections, MarkdownCharts(folder=tmp_path / "c", relative_to=tmp_path))
    assert "INCOMPLETE, #1" in report
    (row,) = export_rows(run)
    assert row["incomplete"] is True and (row["rounds"], row["planned_rounds"]) == (2, 4)
    save_result(run, tmp_path / "111111111111.json")
    (history,) = load_history([tmp_path / "111111111111.json"])
    assert "2 of 4 rounds: incomplete" in scenario_page(history)
    longer = dataclasses.replace(short, seq_len=128)
    two = run_of(ok(short, 100, seed=41, rounds=2), ok(longer, 190, seed=42, rounds=4))
    figure = time_vs_seq(sources_for([two]), "synthetic")
    assert not isinstance(figure, str), figure
    assert any("INCOMPLETE: 1 of 2 cases incomplete" in t.get_text() for t in figure.texts)
