"""Rank functions of tests/bench/doctor/test_doctor.py: the doctor's checks that take every rank
(bench.doctor.rank: the collectives and the layer under each mode) with a failure injected on one rank."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from bench.doctor import rank as doctor_rank
from gdn_cp.distributed import resolve_platform

CHECK_LIMIT_S = 5.0
"""Each check's limit: how long a peer of the failing rank waits inside a gloo collective (no abort there)."""


def distributed_checks_with_a_failure(mode: str) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The collective and layer checks (default backend) on this rank, rank 1's layer check under `mode`
    raising before its first collective while rank 0 is inside the layer's; (name, status, detail) of each
    row, and any exception a thread of this rank raised."""
    thread_errors: list[str] = []
    threading.excepthook = lambda args: thread_errors.append(repr(args.exc_value))
    if dist.get_rank() == 1:
        real = doctor_rank.compare_layer_under_cp

        def compare(layer, *, mode: str, **kwargs):
            if mode == failing:
                raise RuntimeError(f"injected failure in {mode}")
            return real(layer, mode=mode, **kwargs)

        failing = mode
        doctor_rank.compare_layer_under_cp = compare
    device = torch.device("cpu")
    checks = doctor_rank.DistributedChecks("gloo", CHECK_LIMIT_S)
    rows = [
        *doctor_rank.collective_checks(device, resolve_platform("cpu"), checks),
        *doctor_rank.layer_checks(device, [], checks),
    ]
    return [(c.name, c.status, c.detail) for c in rows], thread_errors
