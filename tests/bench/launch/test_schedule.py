"""The order of rounds: a seeded shuffle per round (replayable), one batch per CP degree, only the rounds a
case still needs, and --stop-after-round. Pure."""

from __future__ import annotations

import dataclasses

from tiny import tiny_scenario

from bench.launch.schedule import round_batches, slot_work, slots_left, work_left
from bench.suite.config import Sweep

SCENARIO = tiny_scenario(
    sweep=Sweep(cp=[1, 2], seq_len=[64, 128], mode=["ulysses", "p2p"]),
)
CASES = SCENARIO.cases(warmup=1, repeat=2, rounds=3)


def order(batches) -> list[str]:
    return [slot.case.key() for batch in batches for slot in batch.slots]


def test_each_round_is_a_seeded_shuffle_grouped_by_cp():
    first = round_batches(CASES, {}, 0, seed=7)
    assert sorted(order(first)) == sorted(c.key() for c in CASES)  # every case once
    assert len(first) == 2 and {b.cp for b in first} == {1, 2}  # one pool per CP degree
    assert all(slot.case.cp == batch.cp and slot.round == 0 for batch in first for slot in batch.slots)
    positions = sorted(slot.position for batch in first for slot in batch.slots)
    assert positions == list(range(len(CASES)))  # the place in the shuffled round is recorded
    assert order(round_batches(CASES, {}, 0, seed=7)) == order(first)  # replayable from the seed
    shuffles = {tuple(order(round_batches(CASES, {c.key(): 1 for c in CASES}, 1, seed=s))) for s in range(8)}
    assert len(shuffles) > 1  # other seeds, other orders


def test_only_the_rounds_a_case_lacks_and_stop_after_round():
    done = {CASES[0].key(): 2, CASES[1].key(): 3}
    assert CASES[0].key() not in order(round_batches(CASES, done, 0, seed=1))
    assert order(round_batches(CASES, done, 2, seed=1)) == [CASES[0].key()]
    assert round_batches(CASES, {c.key(): 3 for c in CASES}, 3, seed=1) == []
    assert slots_left(CASES, done) == 3 * len(CASES) - 5
    assert slots_left(CASES, {}, stop_after=1) == len(CASES)
    assert round_batches(CASES, {c.key(): 1 for c in CASES}, 1, seed=1, stop_after=1) == []
    one = dataclasses.replace(CASES[2], rounds=1)
    assert round_batches([one], {}, 1, seed=1) == []


def test_the_time_left_weighs_each_case_by_its_kind():
    """Issue 37: the ETA read 1:43 left at 139/190 with 8 minutes to go: it counted cases alike, while a
    long forward+backward costs many short forwards. A case-round's work grows with its tokens and pass,
    and the work left is the sum over the rounds still to run."""
    short = dataclasses.replace(CASES[0], seq_len=2048, pass_="forward")
    long = dataclasses.replace(short, seq_len=32768)
    backward = dataclasses.replace(long, pass_="forward_backward")
    assert slot_work(short) < slot_work(long) < slot_work(backward)
    assert slot_work(long) / slot_work(short) > 8  # 16x the tokens, the start's share aside
    done = {CASES[0].key(): 2}
    assert work_left(CASES, done) == sum(3 * slot_work(c) for c in CASES) - 2 * slot_work(CASES[0])
