"""bench.measure.contention: the CPU time other processes took, steal, the "contended" verdict, its place in
results, the case line and compare."""

from __future__ import annotations

import dataclasses

import pytest
from test_compare import case, ok, run_of

from bench.measure.contention import (
    FOREIGN_CEILING,
    MIN_WINDOW_S,
    STEAL_CEILING,
    Contention,
    RankReading,
    Ticks,
    cpu_ticks,
    judge,
)
from bench.results.comparison import compare_runs
from bench.results.store import CaseResult
from bench.results.tables import case_line

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


def test_results_keep_it_and_older_files_load_without_it() -> None:
    result = _contended(ok(case("p2p", 64), 100, seed=1), 0.5)
    assert CaseResult.from_dict(result.to_dict()).contention == result.contention
    older = result.to_dict()
    del older["contention"]
    assert CaseResult.from_dict(older).contention is None
