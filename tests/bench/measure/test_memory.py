"""The CPU memory meter: the profiler's allocation events give the step's peak above its starting level."""

from __future__ import annotations

import torch

from bench.measure.memory import measure_peak, profiler_peak_above_start, tensor_bytes
from gdn_cp.distributed import Platform, resolve_platform
from gdn_cp.distributed import platform as platform_module

MIB = 2**20
SIXTEEN_MIB = 4 * MIB  # fp32 elements


def test_two_live_16_mib_tensors_peak_at_32_mib():
    def step():
        a = torch.ones(SIXTEEN_MIB)
        b = torch.ones(SIXTEEN_MIB)
        del a, b
        torch.ones(1024)  # after the peak: does not move it

    assert profiler_peak_above_start(step) == 32 * MIB


def test_memory_allocated_under_an_earlier_profiler_does_not_leak_into_the_next():
    # The profiler's running total spans profiler sessions: a tensor allocated under one and freed outside
    # it stays in the total. The meter measures from the step's own starting level instead.
    kept = []
    assert profiler_peak_above_start(lambda: kept.append(torch.ones(SIXTEEN_MIB))) == 16 * MIB
    kept.clear()
    assert profiler_peak_above_start(lambda: kept.append(torch.ones(SIXTEEN_MIB))) == 16 * MIB


def test_frees_of_memory_from_before_the_step_may_be_missed():
    # The profiler may not know the size of a block allocated before it started (it says so on stderr), and
    # then freeing it does not lower the total: such a step is over-counted, by at most what it frees. The
    # bench clears gradients before its measured step, so its steps free nothing that predates them.
    old = [torch.ones(SIXTEEN_MIB)]

    def step():
        old.clear()  # -16 MiB, perhaps unseen
        torch.ones(2 * SIXTEEN_MIB)  # +32 MiB: truly 16 MiB above the start

    assert profiler_peak_above_start(step) in (16 * MIB, 32 * MIB)


def test_a_step_without_allocations():
    assert profiler_peak_above_start(lambda: None) == 0


def test_measure_peak_on_cpu_adds_the_live_tensors():
    weight = torch.ones(MIB // 4)  # 1 MiB
    reading = measure_peak(
        lambda: torch.ones(SIXTEEN_MIB).sum(), resolve_platform("cpu"), [weight, weight[:10]]
    )
    assert reading.meter == "cpu-profiler"
    assert reading.baseline_bytes == MIB  # a view of the same storage counts once
    assert 17 * MIB <= reading.peak_bytes <= 17 * MIB + 4096


def test_tensor_bytes_counts_storages_once():
    x = torch.zeros(1000)
    y = torch.zeros(10, dtype=torch.float64)
    assert tensor_bytes([x, x[10:], x.view(10, 100), y]) == 4000 + 80


def test_on_a_device_the_allocator_peak_comes_with_the_device_used_memory(monkeypatch):
    """Issue 20: the allocator misses NCCL/HCCL buffers and the context; every device reading also carries
    mem_get_info's used memory (total - free) of the rank's own device, read after the step."""
    calls: list[tuple] = []

    class FakeCuda:
        def __getattr__(self, name):
            answers = {
                "memory_allocated": 1 * MIB,
                "max_memory_allocated": 5 * MIB,
                "max_memory_reserved": 6 * MIB,
            }
            answers["mem_get_info"] = (60 * 2**30, 80 * 2**30)
            return lambda *a: calls.append((name, *a)) or answers.get(name)

    monkeypatch.setattr(torch, "cuda", FakeCuda())
    monkeypatch.setattr(platform_module, "_chosen", {})
    monkeypatch.setenv("LOCAL_RANK", "3")
    platform = Platform("cuda", "nccl")
    platform.set_device(3)
    reading = measure_peak(lambda: calls.append(("step",)), platform, [])
    assert (reading.peak_bytes, reading.baseline_bytes, reading.meter) == (5 * MIB, 1 * MIB, "cuda-allocator")
    assert reading.device_used_bytes == 20 * 2**30 and reading.reserved_peak_bytes == 6 * MIB
    names = [c[0] for c in calls]
    assert names.index("empty_cache") < names.index("reset_peak_memory_stats") < names.index("step")
    last_info = len(names) - 1 - names[::-1].index("mem_get_info")
    assert names.index("mem_get_info") < names.index("step") < last_info and ("mem_get_info", 3) in calls
    # a paired compare's other layer (live, not this step's) is taken out of the allocator's readings
    other = measure_peak(lambda: None, platform, [], foreign_bytes=MIB // 2)
    assert (other.peak_bytes, other.baseline_bytes) == (5 * MIB - MIB // 2, MIB // 2)
    assert other.device_used_bytes == 20 * 2**30  # the device's used memory cannot be split


class CachingAllocator:
    """A device whose allocator keeps freed blocks cached (as CUDA's and NPU's do): reserved memory, and the
    device's used memory, stay at their high-water mark until empty_cache."""

    TOTAL, CONTEXT = 80 * 2**30, 512 * MIB

    def __init__(self) -> None:
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, n: int) -> None:
        self.allocated -= n  # the block stays cached

    def empty_cache(self) -> None:
        self.reserved = self.allocated

    def reset_peak_memory_stats(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_allocated(self) -> int:
        return self.peak_allocated

    def max_memory_reserved(self) -> int:
        return self.peak_reserved

    def mem_get_info(self, index: int) -> tuple[int, int]:
        return self.TOTAL - self.CONTEXT - self.reserved, self.TOTAL

    def __getattr__(self, name):  # set_device, synchronize, ...
        return lambda *a: None


def test_a_cases_device_memory_does_not_depend_on_what_ran_before_it(monkeypatch):
    """Issue 35: an earlier case (or the matmul calibration) leaves gigabytes cached in the allocator; the
    next case's allocated peak, reserved peak and device used memory read the same as when it runs first."""
    monkeypatch.setattr(platform_module, "_chosen", {})
    monkeypatch.setenv("LOCAL_RANK", "0")

    def case(gib: float):
        def step():
            device.alloc(int(gib * 2**30))
            device.free(int(gib * 2**30))

        return step

    readings = []
    for order in ([2.0], [10.0, 2.0]):  # the 2 GiB case alone, then after a 10 GiB one
        device = CachingAllocator()
        device.alloc(1 * 2**30)  # the layer's parameters and inputs, live throughout
        monkeypatch.setattr(torch, "cuda", device)
        platform = Platform("cuda", "nccl")
        platform.set_device(0)
        readings.append([measure_peak(case(gib), platform, []) for gib in order][-1])
    alone, after = readings
    assert after == alone
    assert alone.peak_bytes == alone.reserved_peak_bytes == 3 * 2**30
    assert alone.device_used_before_bytes == 512 * MIB + 1 * 2**30
    assert alone.device_used_bytes == 512 * MIB + 3 * 2**30  # this case's own cache, not the earlier one's
