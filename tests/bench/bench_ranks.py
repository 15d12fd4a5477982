"""Rank functions for the run tests: the real worker, with failures injected by case (test code only).

Spawned ranks import this module by name, as tests/gdn_cp/distributed does with cp_ranks.
"""

from __future__ import annotations

import os
import time

import torch.distributed as dist

from bench.measure.rank import CaseRound, RankResults, measure_on_rank
from bench.suite.config import Case


def failing_rank_fn(request: Case | CaseRound, device: str) -> RankResults:
    """ulysses forward: every rank raises; ulysses forward_backward: rank 1 dies; all_gather forward: rank 1
    never reaches the barrier (rank 0 times out); anything else: the real worker."""
    case = request.case if isinstance(request, CaseRound) else request
    rank = dist.get_rank()
    if case.mode == "ulysses" and case.pass_ == "forward":
        raise RuntimeError(f"injected failure on rank {rank}")
    if case.mode == "ulysses" and rank == 1:
        os._exit(3)
    if case.mode == "all_gather" and case.pass_ == "forward":
        if rank == 1:
            time.sleep(600)  # killed by the launcher once rank 0 fails
        dist.barrier()
    return measure_on_rank(request, device)


def built_tensors(case: Case, device: str) -> dict:
    """What bench.measure.rank.build_pass gives this rank: parameters, input shard, output gradient shard."""
    from bench.measure.rank import build_pass
    from gdn_cp.distributed import resolve_platform

    *params, x, grad_output = build_pass(case, resolve_platform(device)).live
    return {
        "params": [p.detach().clone() for p in params],
        "x": x.detach().clone(),
        "grad": grad_output.clone(),
    }
