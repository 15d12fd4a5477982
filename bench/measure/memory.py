"""Peak allocated memory of one step on this rank, read on an untimed pass (meters slow the step): the last
warmup pass, so that one-time costs of a first pass (workspaces, communicator buffers, caches) are not
counted as the step's.

What the number includes: everything live when the step starts (the layer's parameters, this rank's input
shard and output gradient; on npu/cuda also anything else the allocator holds for this process) plus the
step's own peak on top (activations saved for backward, gradients, temporaries, communication buffers).

Meters, recorded with every reading:
- "npu-allocator" / "cuda-allocator": the device allocator's peak after Platform.reset_peak_memory: the
  tensors torch allocated. It does not see what the device holds outside torch's allocator (NCCL's and
  HCCL's buffers, the context, the allocator's cached blocks), so on npu/cuda every reading also carries
  the allocator's reserved peak (its blocks, cached ones included) and the device's used memory before and
  after the step (total - free of mem_get_info), the memory a rank really takes. The allocator's cached
  blocks are released first (empty_cache): an earlier case's cache (or the matmul calibration's buffers)
  would otherwise count in this case's reserved and used memory, and its figures would depend on the order
  the cases ran in.
- "cpu-profiler": torch.profiler with profile_memory=True. Each allocation event (and free: a negative
  `alloc_size`) carries `total_allocated`, a running total of bytes allocated minus freed while any profiler
  has been recording in this process. The total does not restart with a new profiler: memory allocated
  under an earlier profiler and freed outside it stays counted. So the step's starting level is taken from
  its first event (total_allocated - alloc_size), and the peak above start is max(total) minus that level;
  the bytes of the tensors live at the start are added to it. The profiler may miss frees of blocks
  allocated before it started (when it does not know their size), so a step that frees older memory can be
  over-counted by up to that much; the rank function clears gradients before the measured step, so its
  steps free nothing older.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from gdn_cp.distributed import Platform, local_rank

MEMORY_RESOLUTION_MIB = 0.5
"""Peak memory differences below this are not told apart from noise: one peak is read per case, so a delta
has no interval, and peaks of one case differ by about 0.2 MiB between runs here (the allocator's and the CPU
meter's own spread). Charts draw no saving below it; `bench history` flags no step below it."""

PROFILER_PRELOAD = ("torch._inductor",)
"""What torch.profiler's first start imports (it checks hasattr(torch, "_inductor"): about 1 s, hundreds of
modules). Local pools preload it in the server their ranks fork from (bench.launch.pool), so that second is
paid once instead of by every rank, and not by the CLI that only starts them."""


@dataclass(kw_only=True, slots=True)
class MemoryReading:
    """Peak allocated bytes of one step on one rank."""

    peak_bytes: int
    """Bytes live at the start of the step plus the step's peak above that."""
    baseline_bytes: int
    """Bytes live at the start of the step (parameters, input, output gradient, ...)."""
    meter: str
    """"npu-allocator", "cuda-allocator" or "cpu-profiler" (see the module docstring)."""
    device_used_bytes: int | None = None
    """npu/cuda: the device's used memory after the step, allocator or not (mem_get_info); None on cpu."""
    device_used_before_bytes: int | None = None
    """npu/cuda: the device's used memory before the step, once the cached blocks are released."""
    reserved_peak_bytes: int | None = None
    """npu/cuda: the allocator's peak reserved bytes during the step (cached blocks included)."""


def _walk(nodes: Iterable) -> Iterator:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one storage count once)."""
    storages = {}
    for t in tensors:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def profiler_peak_above_start(step: Callable[[], object]) -> int:
    """Run `step` under the CPU profiler; the peak of bytes allocated minus freed since it started (>= 0)."""
    # Kineto prints "profiler_start/stop" notices to stderr at every start below level 6 (read at first use).
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    tree = prof.profiler.kineto_results.experimental_event_tree()
    events = sorted((n for n in _walk(tree) if n.tag == _EventType.Allocation), key=lambda n: n.start_time_ns)
    if not events:
        return 0
    first = events[0].extra_fields
    start = first.total_allocated - first.alloc_size
    return max(0, max(e.extra_fields.total_allocated for e in events) - start)


def measure_peak(
    step: Callable[[], object], platform: Platform, live: Iterable[torch.Tensor], *, foreign_bytes: int = 0
) -> MemoryReading:
    """Peak allocated bytes while `step()` runs once on this rank.

    Args:
        step: one pass; what it returns (a forward's output, holding its graph) is dropped after it
        platform: the device; npu/cuda read the allocator, cpu runs the profiler
        live: tensors live at the start that the cpu meter counts as baseline (the allocator sees them anyway)
        foreign_bytes: bytes of tensors live at the start that are not the step's (a paired compare's other
            layer): the allocator's readings are taken less them (the cpu meter counts `live` alone); the
            device's used memory cannot be, and keeps them
    """
    gc.collect()
    platform.synchronize()
    if platform.has_allocator_stats:
        platform.empty_cache()
        free_before, total = platform.memory_info(local_rank()) or (0, 0)
        platform.reset_peak_memory()
        baseline = platform.memory_allocated()
        step()
        platform.synchronize()
        free, total = platform.memory_info(local_rank()) or (0, 0)
        return MemoryReading(
            peak_bytes=platform.max_memory_allocated() - foreign_bytes,
            baseline_bytes=baseline - foreign_bytes,
            meter=f"{platform.device_type}-allocator",
            device_used_bytes=total - free,
            device_used_before_bytes=total - free_before,
            reserved_peak_bytes=platform.max_memory_reserved() - foreign_bytes,
        )
    baseline = tensor_bytes(live)
    return MemoryReading(
        peak_bytes=baseline + profiler_peak_above_start(step), baseline_bytes=baseline, meter="cpu-profiler"
    )
