"""What every rank of `bench profile` runs: one case's pass (bench.measure.rank.build_pass), measured three
ways.

In order, after one warmup pass (every pass starts after a barrier; gradients are cleared between passes):
1. communication: `count_communication()` around one pass, beside the analytic model
   (gdn_cp.distributed.comm_model.case_communication) for this rank;
2. memory: one pass under torch.distributed._tools.mem_tracker.MemTracker, whose peak snapshot splits the
   memory by kind (parameters, gradients, activations, temporaries, buffers; "other" is the input shard and
   the output gradient, registered before the pass);
3. time: `steps` passes under torch.profiler (CPU activities; CUDA where there is a GPU; on npu the
   torch_npu profiler with CPU and NPU activities), each in a record_function `bench.step` that ends with a
   device synchronize; the trace is written to <trace_dir>/rank<r>.json and read back
   (bench.profiling.traces).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.profiler import ProfilerActivity, profile, record_function

from bench.measure.rank import build_pass
from bench.profiling.traces import STEP_LABEL, DeviceExposure, RankTimeline, device_exposure, read_timeline
from bench.suite.config import Case
from gdn_cp.distributed import Platform, count_communication, resolve_platform
from gdn_cp.distributed.collectives import group_rank_size
from gdn_cp.distributed.comm_model import case_communication

MEMORY_METER = "mem_tracker (torch.distributed._tools.mem_tracker.MemTracker, peak snapshot)"


@dataclass(kw_only=True, slots=True)
class RankProfile:
    """What one rank measured (small and picklable: the ranks gather it)."""

    rank: int
    trace_path: str
    """The Chrome trace this rank wrote."""
    timeline: RankTimeline
    """Steps and collectives read from the trace."""
    communication: dict[str, dict[str, int]] = field(default_factory=dict)
    """Counted during one pass: kind -> {sent, received, calls} (CommStats.as_dict())."""
    model: dict[str, dict[str, int]] = field(default_factory=dict)
    """The analytic model for this rank, same layout."""
    memory: dict[str, int] | None = None
    """Peak bytes by kind, in MemTracker's names: Parameter, Gradient, Activation, Temp, Buffer, Other,
    Total."""
    memory_error: str | None = None
    """Why there is no memory breakdown, when the meter failed."""
    device: DeviceExposure | None = None
    """npu/cuda: communication and the part of it no compute hid, from the device's timeline (None on cpu,
    whose host timeline says it: bench.profiling.traces)."""


def _profiler(platform: Platform):
    """A torch.profiler for the platform (the torch_npu profiler on npu, its documented API)."""
    if platform.device_type == "npu":
        import torch_npu  # only imported where the platform is npu (torch_npu is installed then)

        npu = torch_npu.profiler
        return npu.profile(
            activities=[npu.ProfilerActivity.CPU, npu.ProfilerActivity.NPU], record_shapes=True
        )
    activities = [ProfilerActivity.CPU]
    if platform.device_type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    return profile(activities=activities, record_shapes=True)  # shapes: p2p peers are in the trace


def _memory_breakdown(
    step: Callable[[], object], live: list[torch.Tensor]
) -> tuple[dict[str, int] | None, str | None]:
    """Peak bytes by kind of one pass, or (None, why) when the meter cannot run here."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(*live)
        with tracker:
            out = step()
            del out
        snapshot = tracker.get_tracker_snapshot("peak")
    except Exception as exc:  # the meter is a private torch tool: report why instead of failing the profile
        return None, f"{type(exc).__name__}: {exc}"
    totals: dict[str, int] = {}
    for per_device in snapshot.values():
        for kind, nbytes in per_device.items():
            name = getattr(kind, "value", kind)  # a _MemRefType member ("Parameter", ...) or "Total"
            totals[name] = totals.get(name, 0) + int(nbytes)
    return totals, None


def profile_on_rank(
    case: Case, device_kind: str, *, steps: int, trace_dir: str, group: ProcessGroup | None = None
) -> list[RankProfile]:
    """Profile `case` on this rank (see the module docstring); every rank returns every rank's profile.

    Args:
        case: the case to run (its pass: forward, forward and backward, or prefill)
        device_kind: the launch's device (cpu, cuda, npu)
        steps: profiled passes
        trace_dir: folder of the Chrome traces (rank<r>.json), shared by the ranks of one host
        group: the case's process group (None: the default group, a launch of cp ranks; a torchrun job
            gives each case a group of its own over global ranks 0 .. cp - 1)
    """
    # Kineto prints "profiler_start/stop" notices to stderr below level 6 (read at first use).
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    platform = resolve_platform(device_kind)
    rank, cp = group_rank_size(group)
    built = build_pass(case, platform, group)
    step, clear_grads, live = built.step, built.clear_grads, built.live

    def one_pass() -> None:
        dist.barrier(group)
        out = step()
        platform.synchronize()
        del out  # a forward's graph is freed after the pass
        clear_grads()

    one_pass()  # warmup
    with count_communication() as stats:
        one_pass()
    model = case_communication(case.mode, case.comm_case(rank))
    dist.barrier(group)
    memory, memory_error = _memory_breakdown(step, live)
    clear_grads()

    with _profiler(platform) as prof:
        for _ in range(steps):
            dist.barrier(group)  # every step starts together: step-relative times line up across ranks
            with record_function(STEP_LABEL):
                out = step()
                platform.synchronize()
            del out
            clear_grads()
    path = Path(trace_dir) / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    trace: dict[str, Any] = json.loads(path.read_text())
    mine = RankProfile(
        rank=rank,
        trace_path=str(path),
        timeline=read_timeline(trace, rank),
        communication=stats.as_dict(),
        model=model,
        memory=memory,
        memory_error=memory_error,
        device=device_exposure(trace, steps),
    )
    everyone: list[Any] = [None] * cp
    dist.all_gather_object(everyone, mine, group=group)
    return everyone
