"""This rank's matmul throughput: the limit a case's achieved GFLOP/s is set against.

The GDN core's products are batched matmuls of chunk-sized blocks, C x K by K x V (chunk size, key and
value head dims), so the calibration times exactly that shape: a batch of such products in the dtype the
core's matmuls run in, with the rank's own threads, the best of a few readings kept (the limit, not the
typical). The batch is sized to keep the device busy: about 2^27 FLOPs a call on cpu, where a call takes
milliseconds, and 2^36 on an accelerator, where a smaller one is over before its launch is (a GPU runs
2^27 FLOPs in well under a microsecond); an accelerator's calls are timed on its own clock, between
device events around several calls back to back (Platform.time_s), so that the host's launch latency and
synchronisation are not counted as matmul time. It takes a few tens of milliseconds, once per rank
process, shape and dtype: every case of a pool lifetime (bench.launch.pool) is set against the same
reading, so their fractions compare without the calibration's own noise. On a busy machine the best of a
few is still slowed down: compare fractions only between cases measured on an idle one.

The dtype is named as the matmul runs it: fp32, tf32 (fp32 with TF32 matmuls allowed, on a GPU), hf32 (the
same on an Ascend NPU), bf16, fp16, fp64 (`matmul_dtype_name`).
"""

from __future__ import annotations

import torch

from gdn_cp.distributed import Platform
from gdn_cp.dtypes import dtype_name

FLOPS_PER_CALL = {"cpu": 2**27, "accelerator": 2**36}
"""FLOPs of one timed batch of products: a CPU call lasts milliseconds; an accelerator's must outlast its
launch."""
CALLS_PER_READING = {"cpu": 1, "accelerator": 10}
"""Back-to-back calls per reading (an accelerator's queue stays full between its two events)."""
REPEATS = 30

_readings: dict[tuple, float] = {}
"""This process's calibrations, by shape, dtype and device."""


def matmul_dtype_name(dtype: torch.dtype, device: torch.device) -> str:
    """The dtype a matmul of `dtype` tensors runs in on `device` now: fp32 is tf32 on a GPU that allows TF32
    matmuls, hf32 on an NPU that allows HF32 (gdn_cp.dtypes.matmul_precision sets both)."""
    if dtype == torch.float32 and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    if dtype == torch.float32 and device.type == "npu" and getattr(torch.npu.matmul, "allow_hf32", False):
        return "hf32"
    return dtype_name(dtype)


def matmul_gflops(
    m: int,
    n: int,
    p: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    platform: Platform,
    max_bytes: int | None = None,
) -> float:
    """GFLOP/s of a batch of [m, n] @ [n, p] products on `device`, best of REPEATS; measured at the first
    call for its arguments in this process, the same reading after. `max_bytes`: the most its three buffers
    may take (a batch that fills the device would out-of-memory at long prefill; fewer products a call
    then, still timed on the device's clock)."""
    key = (m, n, p, dtype, device, matmul_dtype_name(dtype, device))
    if key not in _readings:
        _readings[key] = _calibrate(
            m, n, p, dtype=dtype, device=device, platform=platform, max_bytes=max_bytes
        )
    return _readings[key]


def calibration_batch(m: int, n: int, p: int, *, kind: str, itemsize: int, max_bytes: int | None) -> int:
    """Products per call: FLOPS_PER_CALL's worth, at most what fits in `max_bytes` (at least one)."""
    batch = max(1, FLOPS_PER_CALL[kind] // (2 * m * n * p))
    if max_bytes is not None:
        batch = min(batch, max(1, max_bytes // (itemsize * (m * n + n * p + m * p))))
    return batch


def _calibrate(
    m: int,
    n: int,
    p: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    platform: Platform,
    max_bytes: int | None = None,
) -> float:
    kind = "cpu" if device.type == "cpu" else "accelerator"
    batch = calibration_batch(m, n, p, kind=kind, itemsize=dtype.itemsize, max_bytes=max_bytes)
    a = torch.randn(batch, m, n, dtype=dtype, device=device)
    b = torch.randn(batch, n, p, dtype=dtype, device=device)
    a @ b  # warmup
    platform.synchronize()
    best = min(platform.time_s(lambda: a @ b, CALLS_PER_READING[kind]) for _ in range(REPEATS))
    return 2 * batch * m * n * p / best / 1e9
