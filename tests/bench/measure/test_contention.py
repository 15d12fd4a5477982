"""bench.measure.contention: the CPU time other processes took, steal, the "contended" verdict, its place in
results, the case line and compare."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from bench.formats import CONTENDED_MARK, case_line
from bench.judge.comparison import compare_runs
from bench.launch import sweep
from bench.launch.launcher import Outcome
from bench.measure.contention import (
    FOREIGN_CEILING,
    MIN_WINDOW_S,
    STEAL_CEILING,
    Contention,
    RankReading,
    Ticks,
    Window,
    cpu_ticks,
    judge,
    probe,
    with_earlier,
)
from bench.measure.rank import RankMemory, RankResults
from bench.records import from_dict, to_dict
from bench.render import run_tables
from bench.render.charts import sources_for, time_vs_seq
from bench.render.document import render_markdown
from bench.render.report import build_report
from bench.render.report_run import report_runs
from bench.results.export import export_rows
from bench.results.store import CaseResult
from tests.bench.commands.test_compare import case, ok, run_of

CPUS = 2


def _reading(host: str, cpu_s: float, busy: float, steal: float = 0.0, wall: float = 1.0) -> RankReading:
    """A rank's reading over `wall` seconds of a host whose CPUs were busy `busy` CPU-seconds in all."""
    return RankReading(
        host, cpu_s, Ticks(100.0, 0.0, 1000.0), Ticks(100.0 + busy, steal, 1000.0 + CPUS * wall)
    )


@pytest.fixture(autouse=True)
def _two_cpus(monkeypatch):
    monkeypatch.setattr("bench.measure.contention.os.cpu_count", lambda: CPUS)


def test_foreign_is_the_host_busy_time_the_ranks_did_not_use() -> None:
    # Two ranks on one host used 1.9 of its 2 CPU-seconds: idle, whatever their threads did.
    idle = judge(
        [_reading("a", 0.95, 1.92), _reading("a", 0.95, 0.0)], load_before=0.1, load_after=0.2, pinned=True
    )
    assert not idle.contended and idle.foreign == pytest.approx(0.01)
    # Another process took a core's worth: half the host.
    shared = judge(
        [_reading("a", 0.5, 1.5), _reading("a", 0.5, 0.0)], load_before=2.0, load_after=3.0, pinned=True
    )
    assert shared.contended and shared.foreign == pytest.approx(0.25)
    assert shared.reason == f"other processes used 25% of the CPUs > {FOREIGN_CEILING:.0%}"
    # One rank per host: each host's own ranks are subtracted, and the worst host counts.
    hosts = judge(
        [_reading("a", 1.0, 1.0), _reading("b", 0.2, 1.8)], load_before=None, load_after=None, pinned=False
    )
    assert hosts.foreign == pytest.approx(0.8)
    # The hypervisor's share.
    stolen = judge([_reading("a", 1.0, 1.0, steal=0.2)], load_before=None, load_after=None, pinned=False)
    assert stolen.steal == pytest.approx(0.1) and stolen.reason == f"steal 10.0% > {STEAL_CEILING:.0%}"


def test_a_window_too_short_for_the_ticks_gives_no_figure() -> None:
    short = judge(
        [_reading("a", 0.0, 0.05, wall=MIN_WINDOW_S / 2)], load_before=None, load_after=None, pinned=False
    )
    assert short.foreign is None and not short.contended
    missing = judge([RankReading("a", 0.1, None, None)], load_before=None, load_after=None, pinned=False)
    assert missing.foreign is None and missing.steal is None


def test_this_hosts_proc_stat() -> None:
    ticks = cpu_ticks()  # Linux: cumulative CPU seconds, steal and busy within the total
    assert ticks is None or (0 <= ticks.steal <= ticks.total and 0 <= ticks.busy <= ticks.total)
    window = probe(0.05)  # this process waits: it uses (almost) none of the window
    assert window is None or (0 <= window.own_s < 0.05 and window.total_s > 0)


def _contended(result: CaseResult, foreign: float) -> CaseResult:
    """`result` timed while other processes took `foreign` of the CPUs, in every round (as the case says)."""
    shared = Contention(foreign, 0.0, 1.0, 2.0, True)
    rounds = [dataclasses.replace(r, contention=shared) for r in result.rounds]
    return dataclasses.replace(result, rounds=rounds, contention=shared)


def test_contended_cases_get_no_verdict_and_are_marked() -> None:
    base = run_of(ok(case("p2p", 64), 100, seed=1), ok(case("ulysses", 64), 100, seed=2))
    head = run_of(_contended(ok(case("p2p", 64), 250, seed=3), 0.4), ok(case("ulysses", 64), 250, seed=4))
    verdicts = {c.key.split("/")[1]: c.verdict for c in compare_runs(base, head).cases}
    assert verdicts == {"p2p-ckpt-cp2-T64-fwd": "contended", "ulysses-cp2-T64-fwd": "worse"}
    assert compare_runs(base, head).summary() == "0 better, 1 worse, 0 ~, 0 not comparable, 1 contended"
    line = case_line(head.cases[0])
    assert "contended" in line and "other processes used 40% of the CPUs" in line
    assert "contended" not in case_line(base.cases[0])


def test_results_keep_it() -> None:
    result = _contended(ok(case("p2p", 64), 100, seed=1), 0.5)
    assert from_dict(CaseResult, to_dict(result)).contention == result.contention


def _window(wall: float, foreign: float, own: float = 0.0) -> Window:
    """A window of `wall` seconds on the CPUS, other processes busy `foreign` of them, the case's own ranks
    `own` CPU-seconds."""
    total = CPUS * wall
    return Window(busy_s=own + foreign * total, own_s=own, steal_s=0.0, total_s=total)


def test_a_short_window_is_judged_with_the_windows_before_it() -> None:
    short = _window(MIN_WINDOW_S / 10, 0.0, own=0.05)
    alone = judge(
        [RankReading("a", 0.05, Ticks(0.0, 0.0, 0.0), Ticks(0.05, 0.0, short.total_s))],
        load_before=None,
        load_after=None,
        pinned=False,
    )
    assert alone.foreign is None and alone.window == short  # too short for the ticks on its own
    # another process burnt the cores just before: the case is judged over its window and enough earlier ones
    busy = [_window(MIN_WINDOW_S / 4, 0.5)] * 8
    judged = with_earlier(alone, busy)
    assert judged.earlier == 4 and judged.foreign == pytest.approx(0.5 * 4 / 4.4)
    assert judged.contended and "over this case and the 4 windows before it" in judged.reason
    assert not with_earlier(alone, [_window(MIN_WINDOW_S, 0.01)]).contended  # an idle moment before: clean
    assert with_earlier(alone, [short]) == alone  # still too short: unknown, as before
    long = dataclasses.replace(alone, window=_window(MIN_WINDOW_S, 0.0), foreign=0.0)
    assert with_earlier(long, busy) == long  # a window long enough speaks for itself
    stored = dataclasses.replace(_contended(ok(case(), 1), 0.0), contention=judged)
    again = from_dict(CaseResult, to_dict(stored))
    assert again.contention == judged  # kept in result files


def test_a_sweep_of_short_cases_on_a_busy_machine_flags_every_one(monkeypatch) -> None:
    """Every case-round far shorter than the ticks need, another process taking half the CPUs all along (the
    idle probe before the first case sees it too): every round is contended; on an idle machine none is."""
    for foreign, contended in ((0.5, True), (0.0, False)):
        monkeypatch.setattr(sweep, "probe", lambda f=foreign: _window(MIN_WINDOW_S, f))
        launcher = _ShortCases(foreign)
        cases = [dataclasses.replace(case("p2p", n), rounds=2) for n in (64, 128, 256)]
        results = sweep.run_rounds(cases, launcher, None, seed=0)
        assert [r.status for r in results] == ["ok"] * 3
        assert all(rd.contended == contended for r in results for rd in r.rounds)
        assert all(r.contention.contended == contended for r in results)


class _ShortCases:
    """A launcher whose every case-round lasts 10 ms, with other processes busy `foreign` of the CPUs."""

    def __init__(self, foreign: float) -> None:
        self.foreign = foreign

    @contextlib.contextmanager
    def pool(self, cp: int) -> Iterator[_ShortCases]:
        yield self

    def run(self, c) -> Outcome:
        window = _window(0.01, self.foreign, own=0.01)
        shared = Contention(None, None, 0.0, 0.0, True, window=window)
        results = RankResults(
            samples_s=[[0.003, 0.003]] * c.cp,
            memory=RankMemory(
                peak_bytes=[1 << 20] * c.cp, baseline_bytes=[1 << 19] * c.cp, meter="cpu-profiler"
            ),
            device_name="cpu",
            threads=1,
            matmul_gflops=[50.0] * c.cp,
            matmul_dtype="fp32",
            contention=shared,
        )
        return Outcome(status="ok", results=results, wall_s=0.01)


def test_a_contended_run_is_marked_in_every_output() -> None:
    """Two of three cases timed only on a shared machine: bench show (cells, summary line, markdown title),
    the report (title, banner, contents), the export (columns) and the charts (crosses, title) all say so."""
    run = run_of(
        _contended(ok(case("p2p", 64), 100, seed=1), 0.5),
        _contended(ok(case("p2p", 128), 180, seed=2), 0.5),
        ok(case("ulysses", 64), 100, seed=3),
    )
    console = Console(width=250, record=True, file=io.StringIO())
    run_tables.render(run, console)
    text = console.export_text()
    assert "contended: 2 of 3 cases contended" in text and "6 of 9 rounds" in text
    assert text.count(CONTENDED_MARK.strip()) >= 2 + 1  # two cells, and the summary line
    assert run_tables.markdown(run).splitlines()[0].endswith("(mostly contended)")

    title, sections = build_report(report_runs([run], [Path("run.json")]))
    assert title.endswith("mostly CONTENDED")
    overview = render_markdown(title, sections[:1], charts=None)
    assert "CONTENDED, #1 main@aaaaaaaa: 2 of 3 cases contended" in overview
    assert "(2 of them CONTENDED)" in overview

    rows = {r["case_id"]: r for r in export_rows(run)}
    shared = rows["p2p-ckpt-cp2-T64-fwd"]
    assert shared["contended"] is True and shared["contended_rounds"] == 3
    assert rows["ulysses-cp2-T64-fwd"]["contended"] is False

    figure = time_vs_seq(sources_for([run]), "synthetic")
    assert figure.get_suptitle().startswith("MOSTLY CONTENDED")
    rings = [line for ax in figure.axes for line in ax.get_lines() if line.get_label() == "_contended"]
    assert sum(len(line.get_xdata()) for line in rings) == 2
