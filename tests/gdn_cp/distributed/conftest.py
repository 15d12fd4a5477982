"""One launch per world size: every multi-rank check runs in it, and tests read the cached results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cp_ranks
import pytest
from launches import per_world


@pytest.fixture(scope="session")
def world_results() -> Callable[[int], list[dict[str, Any]]]:
    """world size -> each rank's `cp_ranks.run_world` results (launched on first use, then cached)."""
    return per_world(cp_ranks.run_world, timeout_s=120)
