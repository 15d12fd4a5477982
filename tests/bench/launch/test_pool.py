"""Rank pools with real processes over gloo on 127.0.0.1: many cases in one lifetime, and a case that
raises, runs out of memory, dies, stops or hangs fails alone, with its root cause, while the rest run.
Every wait is bounded (the pool's limits, and pytest's timeout), so a bug fails instead of hanging."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pool_ranks
import pytest

from bench.launch.pool import RankPool

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(180)]

LIMIT_S = 4.0
"""What a stuck case may take beyond its limit: the stack dump, killing the ranks."""


def test_one_lifetime_runs_many_cases_and_each_failure_fails_alone():
    with RankPool(2, pool_ranks.act, device="cpu", threads=1, timeout_s=60) as pool:
        first, second = pool.run(("ok", 0)), pool.run(("ok", 1))
        assert first.ok and second.ok and first.value["pid"] == second.value["pid"]  # one lifetime
        assert pool.starts == 1 and first.value["world"] == 2
        answers = {
            action: pool.run((action, rank))
            for action, rank in (("raise", 1), ("oom", 0), ("kill", 1), ("exit", 1))
        }
        after = pool.run(("ok", 0))  # and the pool restarts for the cases left
    assert str(answers["raise"].failure) == "rank 1 failed: ValueError: rank 1 broke on purpose"
    assert str(answers["oom"].failure).startswith("rank 0 failed: MemoryError: rank 0 could not allocate")
    assert str(answers["kill"].failure) == (
        "rank 1 failed: killed by signal SIGKILL (SIGKILL: often the out-of-memory killer)"
    )
    assert str(answers["exit"].failure).startswith(
        "rank 1 failed: exited with code 3 without a Python exception"
    )
    assert after.ok and after.value["pid"] != first.value["pid"]
    assert pool.starts == 5  # the first lifetime, then one after each failure
    assert not pool.alive


@pytest.mark.parametrize("world", [1, 2])
def test_a_stopped_rank_fails_the_case_within_its_limit_and_is_named(world: int):
    """SIGSTOP outside any collective: at cp 1 nothing else would ever notice; at cp 2 the other rank
    waits in a barrier and is the victim, not the cause."""
    stopped = world - 1
    with RankPool(world, pool_ranks.act, device="cpu", threads=1, timeout_s=LIMIT_S) as pool:
        assert pool.run(("ok", 0)).ok
        start = time.monotonic()
        answer = pool.run(("stop", stopped))
        took = time.monotonic() - start
    message = str(answer.failure)
    assert took >= LIMIT_S, took  # it waited out the limit (a loaded machine only makes this longer)
    assert message.startswith(f"rank {stopped} failed: stuck: the case passed its wall-clock limit of 4 s")
    assert f"rank {stopped} is stopped (process state T" in message
    if world == 2:
        assert "rank 0 waits in a collective" in message and "in barrier" in message


def test_a_rank_busy_outside_a_collective_is_named_with_where_it_is():
    with RankPool(2, pool_ranks.act, device="cpu", threads=1, timeout_s=LIMIT_S) as pool:
        answer = pool.run(("sleep", 0))
    message = str(answer.failure)
    assert message.startswith("rank 0 failed: stuck:")
    assert "rank 0 is busy outside any collective, at " in message and "pool_ranks.py" in message
    assert "rank 1 waits in a collective" in message


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from /proc (Linux)")
def test_the_pool_listens_only_on_loopback():
    with RankPool(2, pool_ranks.listening, device="cpu", threads=1, timeout_s=60) as pool:
        answer = pool.run(os.getpid())
    addresses = answer.value["parent"]
    assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
