"""Run cases in rounds (bench.launch.schedule), a pool per CP degree and round, and record each case's
result after every round it finishes.

A case whose round fails (exception, OOM, dead or stuck rank, collective timeout) is recorded as failed with
its error, and runs no further rounds; the others go on. A resumed file's ok cases keep their rounds and get
only the rounds they lack; its failed cases start again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from bench.launch.launcher import Outcome
from bench.launch.schedule import Slot, round_batches, rounds_wanted
from bench.measure.contention import Contention, Window, probe, with_earlier
from bench.measure.gate import fingerprint_difference
from bench.measure.rank import CaseRound, RankMemory, RankResults
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
    def run(self, case: Case | CaseRound) -> Outcome: ...


class Launcher(Protocol):
    def pool(self, cp: int) -> contextlib.AbstractContextManager[CaseRunner]:
        """One lifetime of ranks for cases of `cp` ranks (bench.launch.launcher)."""
        ...


def with_round(previous: CaseResult | None, case: Case, outcome: Outcome, position: int) -> CaseResult:
    """The case's record after one more round: its samples appended, estimate and summaries recomputed (the
    memory, what ran and the gate's checks are the first round's of a run: kept from `previous` where this
    round has none); or the failure (earlier rounds kept for the record, no timing)."""
    ok_before = previous is not None and previous.status == "ok"
    rounds = list(previous.rounds) if ok_before else []
    wall = (previous.wall_s if ok_before else 0.0) + outcome.wall_s
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
            first_use_s=r.first_use_s,
        )
    )
    used = clean_rounds(rounds)
    pooled = [[s for rd in rounds for s in rd.samples_s[rank]] for rank in range(case.cp)]
    worst = max(
        (rd.contention for rd in used if rd.contention is not None),
        key=lambda c: (c.contended, c.foreign or 0.0, c.steal or 0.0),
        default=None,
    )
    kept = previous if ok_before else None
    return CaseResult(
        case=case,
        status="ok",
        rounds=rounds,
        estimate=estimate([rd.median_s for rd in used]),
        timing=summarize(pooled),
        memory=_memory(r.memory) if r.memory is not None else (kept.memory if kept else None),
        threads_per_rank=r.threads,
        throughput=_throughput(case, r) or (kept.throughput if kept else None),
        contention=worst,
        wall_s=wall,
        ran=r.ran if r.ran is not None else (kept.ran if kept else None),
        check=r.check if r.check is not None else (kept.check if kept else None),
    )


def _memory(m: RankMemory) -> MemoryResult:
    return MemoryResult(
        peak_bytes=max(m.peak_bytes),
        per_rank_bytes=m.peak_bytes,
        baseline_bytes=m.baseline_bytes,
        meter=m.meter,
        device_used_bytes=m.device_used_bytes,
        device_used_before_bytes=m.device_used_before_bytes,
        reserved_peak_bytes=m.reserved_peak_bytes,
    )


def _throughput(case: Case, r: RankResults) -> ThroughputResult | None:
    """The case's model FLOPs against the slowest rank's matmul reading; None where a rank has none (its
    calibration did not fit in the device's free memory)."""
    if any(g is None for g in r.matmul_gflops):
        return None
    return ThroughputResult(
        model_flops=case.layer.flops(
            batch=case.batch, seq_len=case.seq_len, backward=case.pass_ == "forward_backward"
        ),
        matmul_gflops=min(r.matmul_gflops),
        matmul_dtype=r.matmul_dtype,
    )


def twin_key(case: Case) -> tuple:
    """What a case computes, whatever its CP: cases with equal twin keys compute the same outputs, so that
    one at cp 1 is the reference of the others (the gate's fingerprints)."""
    return (
        repr(case.layer),
        case.seq_len,
        case.batch,
        case.seed,
        case.pass_,
        repr(case.documents),
        case.precision,
    )


def against_twin(result: CaseResult, twins: Mapping[tuple, CaseResult]) -> CaseResult:
    """`result` checked against the run's cp 1 case computing the same (`twin_key`), where there is one with
    fingerprints: failed, with one line, when their fingerprints differ beyond the gate's bar; the twin's id
    and the distance recorded in its check otherwise."""
    twin = twins.get(twin_key(result.case))
    check = result.check
    if result.status != "ok" or check is None or check.reference is not None or twin is None:
        return result
    if twin.key == result.key or twin.check is None:
        return result
    found = fingerprint_difference(check.fingerprints, twin.check.fingerprints)
    if found is None:
        return result
    name, rel = found
    if rel > check.bar:
        what = {"o": "o", "input_grad": "the input gradient", "state": "the final state"}[name]
        error = (
            f"outputs differ from the same case at cp 1 ({twin.case.case_id}): rel-L2 {rel:.1e} on {what} "
            f"(bar {check.bar:.0e}); its timings are not kept"
        )
        return CaseResult(
            case=result.case, status="failed", error=error, wall_s=result.wall_s, ran=result.ran
        )
    checked = dataclasses.replace(check, reference=twin.case.case_id, reference_rel_l2=rel)
    return dataclasses.replace(result, check=checked)


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
    measured: set[str] = set()  # cases with a round in this run: the gate's checks ran in their first
    with contextlib.closing(slots):
        for slot, runner in slots:
            on_start(slot)
            key = slot.case.key()
            outcome = runner.run(CaseRound(slot.case, first_round=key not in measured))
            measured.add(key)
            judge_with_earlier(outcome, recent)
            result = with_round(latest.get(key), slot.case, outcome, slot.position)
            for checked in _gated(result, latest):
                latest[checked.key] = checked
                if checked.status == "ok":
                    done[checked.key] = len(checked.rounds)
                else:
                    ended.add(checked.key)
                if writer is not None:
                    writer.add(checked)
            on_done(slot, latest[key])
    return [latest[c.key()] for c in cases if c.key() in latest]


def _gated(result: CaseResult, latest: Mapping[str, CaseResult]) -> list[CaseResult]:
    """`result` checked against its cp 1 twin (`against_twin`), first; and where it is a cp 1 case, the
    results of `latest` it is the twin of and that were measured before it, checked against it now."""
    out = [against_twin(result, _twins(latest.values(), result))]
    if result.case.cp == 1 and out[0].check is not None:
        mine = {twin_key(result.case): out[0]}
        for other in latest.values():
            if other.key != result.key and twin_key(other.case) in mine:
                checked = against_twin(other, mine)
                if checked is not other:
                    out.append(checked)
    return out


def _twins(results: Iterable[CaseResult], *more: CaseResult) -> dict[tuple, CaseResult]:
    """The ok cp 1 cases with the gate's fingerprints, by twin_key."""
    return {
        twin_key(r.case): r
        for r in (*results, *more)
        if r.status == "ok" and r.case.cp == 1 and r.check is not None
    }
