"""Run cases one launch at a time and record each result as soon as it finishes.

A failed case (exception, OOM, dead rank, collective timeout) is recorded with its error and the sweep goes
on; cases already ok in a resumed file are not run again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from bench.launch.launcher import Outcome
from bench.measure.timing import summarize
from bench.results.store import CaseResult, MemoryResult, ResultWriter, ThroughputResult
from bench.suite.config import Case


class Launcher(Protocol):
    def run(self, case: Case) -> Outcome: ...


def to_case_result(case: Case, outcome: Outcome) -> CaseResult:
    """The stored record of one launch: the timing summary (rank-max) and memory (rank-max) when ok."""
    if outcome.status != "ok" or outcome.results is None:
        return CaseResult(case=case, status=outcome.status, error=outcome.error, wall_s=outcome.wall_s)
    r = outcome.results
    return CaseResult(
        case=case,
        status="ok",
        samples_s=r.samples_s,
        timing=summarize(r.samples_s),
        memory=MemoryResult(
            peak_bytes=max(r.peak_bytes),
            per_rank_bytes=r.peak_bytes,
            baseline_bytes=r.baseline_bytes,
            meter=r.meter,
        ),
        threads_per_rank=r.threads,
        throughput=ThroughputResult(
            model_flops=case.layer_config().flops(
                batch=case.batch, seq_len=case.seq_len, backward=case.pass_ == "forward_backward"
            ),
            matmul_gflops=min(r.matmul_gflops),
        ),
        contention=r.contention,
        wall_s=outcome.wall_s,
    )


def run_cases(
    cases: Sequence[Case],
    launcher: Launcher,
    writer: ResultWriter | None,
    *,
    on_start: Callable[[Case], None] = lambda case: None,
    on_done: Callable[[CaseResult], None] = lambda result: None,
) -> list[CaseResult]:
    """Run `cases` in order; write each result (when `writer` is given) before starting the next."""
    results = []
    for case in cases:
        on_start(case)
        result = to_case_result(case, launcher.run(case))
        if writer is not None:
            writer.add(result)
        results.append(result)
        on_done(result)
    return results
