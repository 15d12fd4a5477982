"""The matmul calibration (bench.measure.throughput): sized to the device's free memory, and a reading that
does not fit never costs the case its timings."""

from __future__ import annotations

import torch
from tiny import TINY_LAYER

from bench.launch.launcher import Outcome
from bench.launch.sweep import with_round
from bench.measure import rank as rank_module
from bench.measure.contention import Contention
from bench.measure.rank import RankMemory, RankResults
from bench.measure.throughput import FLOPS_PER_CALL, calibration_batch
from bench.suite.config import Case
from gdn_cp.distributed import resolve_platform


def test_the_calibration_batch_fits_in_what_it_may_take():
    """Issue 45: an accelerator's batch of 2^36 FLOPs of 64 x 128 @ 128 x 128 products took about 4 GiB
    fp32 whatever the device held; with `max_bytes` its three buffers stay within it."""
    m, n, p = 64, 128, 128
    full = calibration_batch(m, n, p, kind="accelerator", itemsize=4, max_bytes=None)
    assert full == FLOPS_PER_CALL["accelerator"] // (2 * m * n * p)
    assert full * 4 * (m * n + n * p + m * p) > 3 * 2**30  # what it took before: over 3 GiB
    capped = calibration_batch(m, n, p, kind="accelerator", itemsize=4, max_bytes=256 * 2**20)
    assert capped * 4 * (m * n + n * p + m * p) <= 256 * 2**20 < (capped + 1) * 4 * (m * n + n * p + m * p)
    assert calibration_batch(m, n, p, kind="accelerator", itemsize=4, max_bytes=1) == 1


def test_a_calibration_that_does_not_fit_keeps_the_cases_timings(monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(rank_module, "matmul_gflops", out_of_memory)
    cpu = torch.device("cpu")
    assert rank_module._core_gflops(TINY_LAYER, torch.float32, cpu, resolve_platform("cpu")) is None
    case = Case(
        scenario="s", mode="p2p", checkpoint=True, cp=2, seq_len=64, pass_="forward", layer=TINY_LAYER,
        batch=1, seed=0, warmup=1, repeat=2,
    )  # fmt: skip
    results = RankResults(
        samples_s=[[0.01, 0.012]] * 2,
        memory=RankMemory(peak_bytes=[1, 1], baseline_bytes=[0, 0], meter="test"),
        device_name="cpu",
        threads=1,
        matmul_gflops=[None, 50.0],
        matmul_dtype="fp32",
        contention=Contention(None, None, 0.0, 0.0, False),
    )
    result = with_round(None, case, Outcome(status="ok", results=results, wall_s=0.1), 0)
    assert result.status == "ok" and result.estimate is not None and len(result.rounds) == 1
    assert result.throughput is None and result.memory.peak_bytes == 1
