"""The order cases run in: rounds, each a seeded shuffle of the cases due, in one batch per CP degree.

A round runs every case that still needs a round once. Its order is a shuffle seeded by the run's
schedule seed and the round's index (random.Random(f"{seed}:{round}"), recorded in the result file as
RunResult.schedule_seed, each round's place as RoundResult.position), so drift on the machine (another job,
thermal throttling) spreads over all cases instead of landing on the ones that happen to come last, and a
run can be replayed. The cases of one CP degree run in one pool (bench.launch.pool), so a round is one batch
per degree, in the order the shuffle first reaches each degree (round 0 runs its cp 1 batch first, so that
every case's correctness gate finds its single-rank twin measured: bench.measure.gate); the batches' pools
are separate lifetimes, and so are a case's rounds. Pure.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.suite.config import Case


@dataclass(frozen=True, slots=True)
class Slot:
    """One case's place in one round."""

    case: Case
    round: int
    """0-based: the case's round index (its rounds done before it)."""
    position: int
    """Its place in the round's shuffled order."""


@dataclass(frozen=True, slots=True)
class Batch:
    """The cases of one CP degree in one round: one pool lifetime."""

    round: int
    cp: int
    slots: list[Slot]


def new_seed() -> int:
    """A fresh schedule seed (recorded; replaying a run uses the recorded one)."""
    return random.SystemRandom().randrange(2**31)


def rounds_wanted(case: Case, stop_after: int | None) -> int:
    """The rounds this run gives `case`: case.rounds, or fewer with stop_after (bench run
    --stop-after-round, which `bench compare` uses to interleave two sides round by round)."""
    return case.rounds if stop_after is None else min(case.rounds, stop_after)


def round_batches(
    cases: Sequence[Case], done: Mapping[str, int], index: int, seed: int, stop_after: int | None = None
) -> list[Batch]:
    """Round `index`: every case with exactly `index` rounds done (by key, in `done`) that wants more,
    shuffled, grouped into one batch per CP degree."""
    due = [c for c in cases if done.get(c.key(), 0) == index < rounds_wanted(c, stop_after)]
    random.Random(f"{seed}:{index}").shuffle(due)
    by_cp: dict[int, list[Slot]] = {}
    for position, case in enumerate(due):
        by_cp.setdefault(case.cp, []).append(Slot(case=case, round=index, position=position))
    batches = [Batch(round=index, cp=cp, slots=slots) for cp, slots in by_cp.items()]
    if index == 0:  # single-rank cases first: the gate's references (bench.measure.gate) exist for the rest
        batches.sort(key=lambda b: b.cp != 1)
    return batches


PASS_WORK = {"forward": 1.0, "forward_backward": 3.0, "prefill": 1.0}
"""A pass's cost relative to a forward (backward: about twice the forward)."""


def slot_work(case: Case) -> float:
    """A case-round's expected cost, for the time left: its timed passes (warmup and repeats) times the
    pass's cost times the tokens of the whole batch, plus a start (a pool's lifetime) worth a forward of
    1K tokens per rank. Kinds differ by orders of magnitude (a 2K forward, a 32K forward+backward), so a
    count of cases would promise the slow ones at the fast ones' pace."""
    passes = case.warmup + case.repeat
    return passes * PASS_WORK.get(case.pass_, 1.0) * case.batch * case.seq_len + 1024.0 * case.cp


def work_left(cases: Sequence[Case], done: Mapping[str, int], stop_after: int | None = None) -> float:
    """The expected cost (slot_work) of the case-rounds still to run."""
    return sum(max(0, rounds_wanted(c, stop_after) - done.get(c.key(), 0)) * slot_work(c) for c in cases)


def slots_left(cases: Sequence[Case], done: Mapping[str, int], stop_after: int | None = None) -> int:
    """Case-rounds still to run (the progress bar's total; failures can end a case sooner)."""
    return sum(max(0, rounds_wanted(c, stop_after) - done.get(c.key(), 0)) for c in cases)
