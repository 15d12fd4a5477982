"""One launch per world size: every multi-rank check runs in it, and tests read the cached results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cp_ranks
import pytest

from gdn_cp.distributed import run_on_ranks


@pytest.fixture(scope="session")
def world_results() -> Callable[[int], list[dict[str, Any]]]:
    """world size -> each rank's `cp_ranks.run_world` results (launched on first use, then cached)."""
    cache: dict[int, list[dict[str, Any]]] = {}

    def get(world: int) -> list[dict[str, Any]]:
        if world not in cache:
            cache[world] = run_on_ranks(cp_ranks.run_world, world, (world,), timeout_s=120)
        return cache[world]

    return get
