"""This rank's matmul throughput: the limit a case's achieved GFLOP/s is set against.

The GDN core's products are batched matmuls of chunk-sized blocks, C x K by K x V (chunk size, key and
value head dims), so the calibration times exactly that shape: a batch of such products (about 2^27 FLOPs
a call) in the dtype the core accumulates in, with the rank's own threads, a few repeats after a warmup,
the best kept (the limit, not the typical). It takes a few tens of milliseconds, once per rank process and
shape: every case of a pool lifetime (bench.launch.pool) is set against the same reading, so their
fractions compare without the calibration's own noise. On a busy machine the best of a few is still slowed
down: compare fractions only between cases measured on an idle one.
"""

from __future__ import annotations

import time

import torch

from gdn_cp.distributed import Platform

FLOPS_PER_CALL = 2**27
"""The batch of products is sized to about this many FLOPs per timed call."""
REPEATS = 30

_readings: dict[tuple, float] = {}
"""This process's calibrations, by shape, dtype and device."""


def matmul_gflops(
    m: int, n: int, p: int, *, dtype: torch.dtype, device: torch.device, platform: Platform
) -> float:
    """GFLOP/s of a batch of [m, n] @ [n, p] products on `device`, best of REPEATS; measured at the first
    call for its arguments in this process, the same reading after."""
    key = (m, n, p, dtype, device)
    if key not in _readings:
        _readings[key] = _calibrate(m, n, p, dtype=dtype, device=device, platform=platform)
    return _readings[key]


def _calibrate(
    m: int, n: int, p: int, *, dtype: torch.dtype, device: torch.device, platform: Platform
) -> float:
    batch = max(1, FLOPS_PER_CALL // (2 * m * n * p))
    a = torch.randn(batch, m, n, dtype=dtype, device=device)
    b = torch.randn(batch, n, p, dtype=dtype, device=device)
    a @ b  # warmup
    platform.synchronize()
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        a @ b
        platform.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * batch * m * n * p / best / 1e9
