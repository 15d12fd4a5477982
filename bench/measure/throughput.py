"""This rank's matmul throughput: the limit a case's achieved GFLOP/s is set against.

The GDN core's products are batched matmuls of chunk-sized blocks (C x K by K x V, C = K = V = 64 at the
usual shapes), so the calibration times exactly that: a batch of 64 x 64 x 64 products in the dtype the
core accumulates in, with the rank's own threads, a few repeats after a warmup, the best kept (the limit,
not the typical). It takes a few tens of milliseconds.
"""

from __future__ import annotations

import time

import torch

from gdn_cp.distributed import Platform

BLOCK = 64
"""Rows and columns of the calibration's products."""
BATCH = 512
"""Products per timed call."""
REPEATS = 5


def matmul_gflops(dtype: torch.dtype, device: torch.device, platform: Platform) -> float:
    """GFLOP/s of [BATCH, BLOCK, BLOCK] @ [BATCH, BLOCK, BLOCK] on `device`, best of REPEATS."""
    a = torch.randn(BATCH, BLOCK, BLOCK, dtype=dtype, device=device)
    b = torch.randn(BATCH, BLOCK, BLOCK, dtype=dtype, device=device)
    flops = 2 * BATCH * BLOCK**3
    a @ b  # warmup
    platform.synchronize()
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        a @ b
        platform.synchronize()
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9
