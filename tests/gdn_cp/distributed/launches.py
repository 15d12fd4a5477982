"""One launch per world size of a module's `run_world`, its results cached for every test that reads them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.launch.local import run_on_ranks


def per_world(run_world: Callable[[int], Any], timeout_s: float) -> Callable[[int], list[Any]]:
    """world size -> each rank's `run_world(world)` results, launched on first use, then cached."""
    cache: dict[int, list[Any]] = {}

    def get(world: int) -> list[Any]:
        if world not in cache:
            cache[world] = run_on_ranks(run_world, world, (world,), timeout_s=timeout_s)
        return cache[world]

    return get
