"""bench.launch.local.run_on_ranks: results by rank, explicit threads, the root cause of a failure (never a
peer's echo), and nothing listening beyond this host."""

from __future__ import annotations

import os
from pathlib import Path

import local_ranks
import pytest

from bench.launch.local import RankFailure, run_on_ranks

pytestmark = pytest.mark.multirank


def test_results_come_back_by_rank_with_the_threads_asked_for() -> None:
    assert run_on_ranks(local_ranks.rank_and_threads, 3, threads_per_rank=1) == [
        (0, 3, 1),
        (1, 3, 1),
        (2, 3, 1),
    ]


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("raise", "rank 1 failed: ValueError: rank 1 broke on purpose"),
        ("exit", "rank 1 failed: exited with code 3 without a Python exception"),
        ("kill", "rank 1 failed: killed by signal SIGKILL (SIGKILL: often the out-of-memory killer)"),
    ],
)
def test_the_failing_rank_is_reported(how: str, message: str) -> None:
    with pytest.raises(RankFailure) as info:
        run_on_ranks(local_ranks.fail, 3, (how,), timeout_s=20)
    assert str(info.value).startswith(message)
    assert info.value.rank == 1


def test_a_hung_rank_fails_the_others_at_the_collective_timeout() -> None:
    with pytest.raises(RankFailure, match="Timed out"):
        run_on_ranks(local_ranks.fail, 2, ("hang",), timeout_s=3)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from /proc (Linux)")
def test_nothing_listens_beyond_this_host() -> None:
    """The launcher's rendezvous store is bound to 127.0.0.1, not every interface (torch's c10d
    rendezvous would listen on 0.0.0.0 / ::), and no rank listens on a wildcard address either."""
    (seen, _) = run_on_ranks(local_ranks.listening_addresses, 2, (os.getpid(),))
    assert seen["launcher"] and all(a.startswith("127.0.0.1:") for a in seen["launcher"]), seen
    wildcard = ("0.0.0.0:", ":::")
    assert not [a for a in seen["launcher"] + seen["ranks"] if a.startswith(wildcard)], seen
