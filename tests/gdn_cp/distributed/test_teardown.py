"""teardown_process_group after every mode's exchanges: no rank resets a connection its peers still read."""

from __future__ import annotations

import cp_ranks
import pytest

from bench.launch.local import run_on_ranks

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize(("world", "seed"), [(2, 0), (3, 1), (4, 2), (2, 3), (3, 4), (4, 5)])
def test_ranks_tear_down_cleanly_after_every_mode(world: int, seed: int) -> None:
    """Issue 21: ranks that ran every mode's exchanges, one of them late to tear down, all exit 0 (a rank
    that destroyed its group first used to reset its peers' last transfers; see teardown_process_group)."""
    ranks = run_on_ranks(cp_ranks.every_mode_then_delay, world, (world, seed), timeout_s=60)
    assert ranks == list(range(world))
