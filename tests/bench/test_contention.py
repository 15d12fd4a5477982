"""bench.measure.contention: utilisation, steal, the "contended" verdict, its place in results, the case line
and compare; and that a real case records it."""

from __future__ import annotations

import dataclasses

import pytest
from test_compare import case, ok, run_of

from bench.measure.contention import (
    STEAL_CEILING,
    UTILISATION_FLOOR,
    Contention,
    cpu_ticks,
    judge,
    steal_between,
    utilisation,
)
from bench.results.comparison import compare_runs
from bench.results.store import CaseResult
from bench.results.tables import case_line


def test_utilisation_is_cpu_time_over_what_the_threads_could_use() -> None:
    assert utilisation(cpu_s=1.8, wall_s=1.0, threads=2) == pytest.approx(0.9)
    # The lowest rank's median decides: one rank that lost its cores is enough.
    walls = [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    idle = judge(
        [[1.9, 2.0, 1.8], [1.9, 1.9, 2.0]], walls, 2, steal=0.0, load_before=0.1, load_after=0.2, pinned=True
    )
    shared = judge(
        [[1.9, 2.0, 1.8], [0.9, 1.0, 1.9]], walls, 2, steal=0.0, load_before=2.0, load_after=3.0, pinned=True
    )
    assert not idle.contended and idle.utilisation == pytest.approx(0.95)
    assert shared.contended and shared.reason == f"utilisation 0.50 < {UTILISATION_FLOOR}"
    # Off CPU there is no utilisation; steal alone decides.
    stolen = judge(None, walls, 2, steal=0.2, load_before=None, load_after=None, pinned=False)
    assert stolen.utilisation is None and stolen.reason == f"steal 20.0% > {STEAL_CEILING:.0%}"


def test_steal_from_proc_stat_ticks() -> None:
    assert steal_between((10, 1000), (60, 2000)) == pytest.approx(0.05)
    assert steal_between(None, (60, 2000)) is None
    ticks = cpu_ticks()  # this machine's /proc/stat (Linux), steal <= total
    assert ticks is None or 0 <= ticks[0] <= ticks[1]


def _contended(result: CaseResult, util: float) -> CaseResult:
    return dataclasses.replace(result, contention=Contention(util, 0.0, 1.0, 2.0, True))


def test_contended_cases_get_no_verdict_and_are_marked() -> None:
    base = run_of(ok(case("p2p", 64), 100, seed=1), ok(case("ulysses", 64), 100, seed=2))
    head = run_of(_contended(ok(case("p2p", 64), 250, seed=3), 0.4), ok(case("ulysses", 64), 250, seed=4))
    verdicts = {c.key.split("/")[1]: c.verdict for c in compare_runs(base, head).cases}
    assert verdicts == {"p2p-ckpt-cp2-T64-fwd": "contended", "ulysses-cp2-T64-fwd": "worse"}
    assert compare_runs(base, head).summary() == "0 better, 1 worse, 0 ~, 0 not comparable, 1 contended"
    line = case_line(head.cases[0])
    assert "contended" in line and "utilisation 0.40" in line
    assert "contended" not in case_line(base.cases[0])


def test_results_keep_it_and_older_files_load_without_it() -> None:
    result = _contended(ok(case("p2p", 64), 100, seed=1), 0.5)
    assert CaseResult.from_dict(result.to_dict()).contention == result.contention
    older = result.to_dict()
    del older["contention"]
    assert CaseResult.from_dict(older).contention is None
