"""Run cases in rounds (bench.launch.schedule), a pool per CP degree and round, and record each case's
result after every round it finishes.

A case whose round fails (exception, OOM, dead or stuck rank, collective timeout) is recorded as failed with
its error, and runs no further rounds; the others go on. A resumed file's ok cases keep their rounds and get
only the rounds they lack; its failed cases start again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Protocol

from bench.launch.launcher import Outcome
from bench.launch.schedule import Slot, round_batches, rounds_wanted
from bench.measure.contention import Contention, Window, probe, with_earlier
from bench.measure.statistics import estimate
from bench.measure.timing import summarize
from bench.results.store import (
    CaseResult,
    MemoryResult,
    ResultWriter,
    RoundResult,
    ThroughputResult,
    clean_rounds,
)
from bench.suite.config import Case


class CaseRunner(Protocol):
    def run(self, case: Case) -> Outcome: ...


class Launcher(Protocol):
    def pool(self, cp: int) -> contextlib.AbstractContextManager[CaseRunner]:
        """One lifetime of ranks for cases of `cp` ranks (bench.launch.launcher)."""
        ...


def with_round(previous: CaseResult | None, case: Case, outcome: Outcome, position: int) -> CaseResult:
    """The case's record after one more round: its samples appended, estimate and summaries recomputed;
    or the failure (earlier rounds kept for the record, no timing)."""
    rounds = list(previous.rounds) if previous is not None and previous.status == "ok" else []
    wall = (previous.wall_s if previous is not None and previous.status == "ok" else 0.0) + outcome.wall_s
    if outcome.status != "ok" or outcome.results is None:
        return CaseResult(case=case, status=outcome.status, error=outcome.error, rounds=rounds, wall_s=wall)
    r = outcome.results
    rounds.append(
        RoundResult(
            samples_s=r.samples_s,
            contention=r.contention,
            wall_s=outcome.wall_s,
            position=position,
            lifetime=outcome.lifetime,
        )
    )
    used = clean_rounds(rounds)
    pooled = [[s for rd in rounds for s in rd.samples_s[rank]] for rank in range(case.cp)]
    worst = max(
        (rd.contention for rd in used if rd.contention is not None),
        key=lambda c: (c.contended, c.foreign or 0.0, c.steal or 0.0),
        default=None,
    )
    return CaseResult(
        case=case,
        status="ok",
        rounds=rounds,
        estimate=estimate([rd.median_s for rd in used]),
        timing=summarize(pooled),
        memory=MemoryResult(
            peak_bytes=max(r.peak_bytes),
            per_rank_bytes=r.peak_bytes,
            baseline_bytes=r.baseline_bytes,
            meter=r.meter,
            device_used_bytes=r.device_used_bytes,
            device_used_before_bytes=r.device_used_before_bytes,
            reserved_peak_bytes=r.reserved_peak_bytes,
        ),
        threads_per_rank=r.threads,
        throughput=ThroughputResult(
            model_flops=case.layer.flops(
                batch=case.batch, seq_len=case.seq_len, backward=case.pass_ == "forward_backward"
            ),
            matmul_gflops=min(r.matmul_gflops),
            matmul_dtype=r.matmul_dtype,
        ),
        contention=worst,
        wall_s=wall,
    )


RECENT = 64
"""Windows kept for `with_earlier` (far more than a short case needs)."""


def judge_with_earlier(outcome: Outcome, recent: list[Window]) -> None:
    """Judge the outcome's contention with the windows before it where its own is too short; its own
    window joins `recent`."""
    found = getattr(outcome.results, "contention", None)
    if not isinstance(found, Contention):
        return
    outcome.results.contention = with_earlier(found, recent)
    if found.window is not None:
        recent.append(found.window)
        del recent[:-RECENT]


def recent_windows() -> list[Window]:
    """The windows a sweep starts with for `judge_with_earlier`: the idle moment before its first case."""
    return [w] if (w := probe()) is not None else []


def round_slots(
    cases: Sequence[Case],
    launcher: Launcher,
    *,
    done: Mapping[str, int],
    ended: Collection[str],
    seed: int,
    stop_after: int | None = None,
) -> Iterator[tuple[Slot, CaseRunner]]:
    """The slots of every case's missing rounds, in their order (bench.launch.schedule), each with the
    runner of the pool it runs in (a lifetime per CP degree and round). `done` (rounds per case key) and
    `ended` (keys that get no more rounds) are read as each round starts: the caller updates them as its
    slots finish. Close it (contextlib.closing) so that an error in the caller closes the pool at once."""
    last = max((rounds_wanted(c, stop_after) for c in cases), default=0)
    for index in range(last):
        live = [c for c in cases if c.key() not in ended]
        for batch in round_batches(live, done, index, seed, stop_after):
            with launcher.pool(batch.cp) as runner:
                for slot in batch.slots:
                    yield slot, runner


def run_rounds(
    cases: Sequence[Case],
    launcher: Launcher,
    writer: ResultWriter | None,
    *,
    seed: int,
    previous: Sequence[CaseResult] = (),
    stop_after: int | None = None,
    on_start: Callable[[Slot], None] = lambda slot: None,
    on_done: Callable[[Slot, CaseResult], None] = lambda slot, result: None,
    opening: Window | None = None,
) -> list[CaseResult]:
    """Run every case's missing rounds (module docstring); write each result (when `writer` is given)
    after every round of it. `previous`: results to continue (a resumed file's ok cases); `opening`: the
    idle moment the caller already measured (bench run's busy check), else one is measured here. Returns
    the results of `cases`, in their order."""
    # Windows of the case-rounds run so far, the idle moment before the first: a case too short for the
    # ticks is judged with those just before it (bench.measure.contention.with_earlier).
    recent = [opening] if opening is not None else recent_windows()
    keys = {c.key() for c in cases}
    latest: dict[str, CaseResult] = {p.key: p for p in previous if p.status == "ok" and p.key in keys}
    done = {key: len(r.rounds) for key, r in latest.items()}
    ended: set[str] = set()
    slots = round_slots(cases, launcher, done=done, ended=ended, seed=seed, stop_after=stop_after)
    with contextlib.closing(slots):
        for slot, runner in slots:
            on_start(slot)
            key = slot.case.key()
            outcome = runner.run(slot.case)
            judge_with_earlier(outcome, recent)
            result = with_round(latest.get(key), slot.case, outcome, slot.position)
            latest[key] = result
            if result.status == "ok":
                done[key] = len(result.rounds)
            else:
                ended.add(key)
            if writer is not None:
                writer.add(result)
            on_done(slot, result)
    return [latest[c.key()] for c in cases if c.key() in latest]
