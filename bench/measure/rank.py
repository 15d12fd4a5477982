"""What every rank of a case runs: build the CP layer, time the pass, measure its memory, gather to all ranks.

Runs inside an initialised process group, in the case's CP group: the default group of a pool of local
ranks (bench.launch.pool), or a group of its own inside a torchrun job (bench.launch.job). Every rank
builds the same weights from the case's seed and draws its own shard, in the case's layout (contiguous or
zigzag), of one global input and output gradient (bench.measure.inputs), and puts the layer under
LinearAttentionContextParallel in that layout. With packed documents every rank passes the same global
boundaries (Case.cu_seqlens) as the layer's cu_seqlens, at cp 1 too.

Timing, per repeat: barrier, device sync, start, the pass, device sync, stop; gradients are cleared between
repeats, outside the timed region. The passes:
- forward: `layer(x, cu_seqlens=...)` with autograd on (as in training: the graph and saved activations
  are built), no backward; the output is dropped after the stop.
- forward_backward: `layer(x, cu_seqlens=...).backward(grad_output)` with a fixed random grad_output
  shard. Parameter gradients stay partial per rank: their reduction over the CP group (an all-reduce or
  FSDP) is not timed.
- prefill: `layer.prefill(x, cu_seqlens=...)` under torch.inference_mode(), as a serving engine runs a
  prompt: no autograd, and the final conv and recurrent states summed onto every rank (their all-reduce is
  timed: it is part of the prefill).
Memory is measured on the last warmup pass (bench.measure.memory: the meter slows the pass, which is
untimed anyway; a first pass's one-time costs are behind it; with warmup 0 on one extra pass first), so it
costs no pass of its own; then each rank's
matmul throughput is read (bench.measure.throughput, once per rank process), the limit its achieved
GFLOP/s is set against. From building the layer to the last timed pass each rank records its CPU time and
the host's CPU time, steal and load (bench.measure.contention: whether other processes shared the
machine); ranks that fit the host's cores are pinned to cores of their own first.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from bench.measure.contention import Contention, RankReading, cpu_ticks, judge, load_average, pin_threads
from bench.measure.inputs import INPUT, OUTPUT_GRAD, local_ranges, shard_tensor
from bench.measure.library import THIS, Library, load_library
from bench.measure.memory import MemoryReading, measure_peak, tensor_bytes
from bench.measure.throughput import matmul_dtype_name, matmul_gflops
from bench.suite.config import Case
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.distributed import Platform, local_rank, local_world_size, resolve_platform
from gdn_cp.distributed.collectives import group_rank_size
from gdn_cp.dtypes import accumulation_dtype, matmul_precision


@dataclass(kw_only=True, slots=True)
class RankResults:
    """What one case measured on every rank (index = rank), identical on all ranks after the gather."""

    samples_s: list[list[float]]
    """[rank][repeat] elapsed seconds of the timed pass."""
    peak_bytes: list[int]
    """[rank] peak allocated bytes of one pass (bench.measure.memory)."""
    baseline_bytes: list[int]
    """[rank] bytes live at the start of that pass."""
    device_used_bytes: list[int] | None
    """[rank] npu/cuda: the device's used memory after that pass (bench.measure.memory); None on cpu."""
    meter: str
    """The memory meter used."""
    device_name: str
    """Name of rank 0's device."""
    threads: int
    """torch intra-op threads of rank 0 (every rank gets the same)."""
    matmul_gflops: list[float]
    """[rank] the rank's batched-matmul GFLOP/s in the dtype the core's matmuls run in
    (bench.measure.throughput)."""
    matmul_dtype: str
    """That dtype, as the matmul runs it (fp32, tf32, bf16, ...)."""
    contention: Contention
    """How shared the machine was during the timed passes (bench.measure.contention)."""
    device_used_before_bytes: list[int] | None = None
    """[rank] npu/cuda: the device's used memory before that pass, the allocator's cache released; None on
    cpu."""
    reserved_peak_bytes: list[int] | None = None
    """[rank] npu/cuda: the allocator's peak reserved bytes during it; None on cpu."""


def _local_shard(case: Case, stream: int, device: torch.device, group: ProcessGroup | None) -> torch.Tensor:
    """This rank's shard [B, T/cp, hidden] of the case's global `stream` tensor (bench.measure.inputs), drawn
    on the CPU for its own positions alone (device RNGs differ), then moved to `device`."""
    rank, cp = group_rank_size(group)
    ranges = local_ranges(case.seq_len, cp, rank, case.layout)
    shape = (case.batch, case.seq_len, case.layer.hidden_size)
    shard = shard_tensor(shape, case.layer.dtype, seed=case.seed, stream=stream, ranges=ranges)
    return shard.to(device)


def cu_seqlens_of(case: Case) -> torch.Tensor | None:
    """[n + 1] int64 global document boundaries of the case (None: unpacked), the same on every rank. On the
    host: the layer reads them as Python ints, so a device copy would only add a synchronisation."""
    bounds = case.cu_seqlens()
    return None if bounds is None else torch.tensor(bounds, dtype=torch.long)


def build_pass(
    case: Case, platform: Platform, group: ProcessGroup | None = None, library: Library = THIS
) -> tuple[Callable[[], torch.Tensor | None], Callable[[], None], list[torch.Tensor]]:
    """The case's layer (built with `library`'s gdn_cp: this checkout's unless a paired compare loaded
    another, bench.measure.library) and data on this rank; returns (step, clear_grads, live tensors).

    `step()` runs the case's pass once: forward returns the output (its autograd graph lives until the caller
    drops it, as in training before backward), forward_backward and prefill return None. `clear_grads()` sets
    every gradient to None.
    """
    device = platform.device(local_rank())
    config = case.layer
    # drawn on the CPU: the same weights on any device
    layer = library.seeded_layer(library.config(config), case.seed, device)
    x = _local_shard(case, INPUT, device, group)
    x.requires_grad_(case.pass_ != "prefill")
    # A prefill has no backward: no output gradient is drawn, so none counts in its memory (the training
    # passes keep theirs, as their results always have).
    grad_output = None if case.pass_ == "prefill" else _local_shard(case, OUTPUT_GRAD, device, group)
    cu_seqlens = cu_seqlens_of(case)
    style = library.context_parallel(
        mode=case.mode, checkpoint_summary=bool(case.checkpoint), layout=case.layout, overlap=case.overlap
    )
    layer = style.apply(layer, group)

    if case.pass_ == "forward":

        def step() -> torch.Tensor | None:
            return layer(x, cu_seqlens=cu_seqlens)

    elif case.pass_ == "prefill":

        def step() -> torch.Tensor | None:
            with torch.inference_mode():
                layer.prefill(x, cu_seqlens=cu_seqlens)
            return None

    else:

        def step() -> torch.Tensor | None:
            layer(x, cu_seqlens=cu_seqlens).backward(grad_output)
            return None

    def clear_grads() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None

    return step, clear_grads, [*layer.parameters(), x, *([] if grad_output is None else [grad_output])]


def warm(step: Callable[[], torch.Tensor | None], clear_grads: Callable[[], None], passes: int) -> None:
    """`passes` untimed passes."""
    for _ in range(passes):
        step()
        clear_grads()


Pass = tuple[Callable[[], torch.Tensor | None], Callable[[], None]]
"""(step, clear_grads) of one built pass (build_pass)."""


def time_passes(
    passes: Sequence[Pass],
    repeat: int,
    platform: Platform,
    group: ProcessGroup | None = None,
    *,
    first: int = 0,
) -> list[list[float]]:
    """`repeat` timed passes of each of `passes` on this rank, [pass][repeat] elapsed seconds. With two (a
    paired compare: base's and head's layer) they take turns, ABBA: repeat i runs them in order when
    i + `first` is even and in reverse when odd, so that neither is always the one that runs right after the
    other; with an odd `repeat` one side runs second once more, which `first` (alternated by round) evens
    out over the rounds."""
    samples: list[list[float]] = [[] for _ in passes]
    for i in range(repeat):
        order = range(len(passes)) if (i + first) % 2 == 0 else range(len(passes) - 1, -1, -1)
        for side in order:
            step, clear_grads = passes[side]
            dist.barrier(group)
            platform.synchronize()
            start = time.perf_counter()
            out = step()
            platform.synchronize()
            samples[side].append(time.perf_counter() - start)
            del out  # a forward's graph is freed after the stop: tearing it down is not part of the pass
            clear_grads()
    return samples


@dataclass(frozen=True, slots=True)
class PairedCase:
    """A case to measure with two checkouts' gdn_cp in one lifetime (bench.launch.paired), base first."""

    case: Case
    roots: tuple[str, str]
    """The worktrees of base and head (bench.measure.library.load_library)."""
    first: int = 0
    """Which side's pass opens the timed turns (time_passes): 0 base, 1 head; alternated by round."""


def measure_on_rank(case: Case, device_kind: str, group: ProcessGroup | None = None) -> RankResults:
    """Time and measure `case` on this rank (the function every rank of a launch runs), in `group` (the
    case's CP group; None: the default group, a launch of cp ranks), its matmuls at the case's precision."""
    platform = resolve_platform(device_kind)
    with matmul_precision(case.precision, platform.device_type):
        return _measure(case, platform, group, [THIS])[0]


def measure_pair_on_rank(
    paired: PairedCase, device_kind: str, group: ProcessGroup | None = None
) -> list[RankResults]:
    """measure_on_rank with base's and head's gdn_cp in this one process, their timed passes in turn
    (time_passes); [base, head], which share the contention window and the matmul reading."""
    libraries = [load_library(root) for root in paired.roots]
    platform = resolve_platform(device_kind)
    with matmul_precision(paired.case.precision, platform.device_type):
        return _measure(paired.case, platform, group, libraries, first=paired.first)


Built = tuple[Callable[[], torch.Tensor | None], Callable[[], None], list[torch.Tensor]]
"""(step, clear_grads, live tensors) of one built pass (build_pass)."""

Gathered = tuple[list[list[float]], list[MemoryReading], float, RankReading, bool]
"""What each rank hands the others: ([side][repeat] seconds, [side] memory, matmul GFLOP/s, contention
reading, pinned)."""


def _peak_memories(built: Sequence[Built], platform: Platform) -> list[MemoryReading]:
    """[side] the peak memory of one pass of each built side on this rank, the other sides' tensors apart."""
    memories = []
    for side, (step, clear_grads, live) in enumerate(built):
        # the last warmup pass (module docstring); the other sides' tensors are not this side's memory
        others = tensor_bytes(t for i, other in enumerate(built) if i != side for t in other[2])
        memories.append(measure_peak(step, platform, live, foreign_bytes=others))
        clear_grads()
    return memories


def _core_gflops(
    layer: GatedDeltaNetConfig, dtype: torch.dtype, device: torch.device, platform: Platform
) -> float:
    """This rank's GFLOP/s of the core's [chunk, head_k_dim] @ [head_k_dim, head_v_dim] in `dtype`."""
    return matmul_gflops(
        layer.chunk_size,
        layer.head_k_dim,
        layer.head_v_dim,
        dtype=dtype,
        device=device,
        platform=platform,
    )


def _gather(mine: Gathered, group: ProcessGroup | None) -> list[Gathered]:
    """[rank] every rank's Gathered, the same on all ranks (one all_gather_object over `group`)."""
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return everyone


def _side_results(
    everyone: list[Gathered],
    side: int,
    *,
    meter: str,
    platform: Platform,
    core_dtype: torch.dtype,
    device: torch.device,
    contention: Contention,
) -> RankResults:
    """The RankResults of `side` (an index into the libraries) from every rank's Gathered."""
    return RankResults(
        samples_s=[r[0][side] for r in everyone],
        peak_bytes=[r[1][side].peak_bytes for r in everyone],
        baseline_bytes=[r[1][side].baseline_bytes for r in everyone],
        device_used_bytes=_per_rank(everyone, side, "device_used_bytes"),
        device_used_before_bytes=_per_rank(everyone, side, "device_used_before_bytes"),
        reserved_peak_bytes=_per_rank(everyone, side, "reserved_peak_bytes"),
        meter=meter,
        device_name=platform.device_name(local_rank()),
        threads=torch.get_num_threads(),
        matmul_gflops=[r[2] for r in everyone],
        matmul_dtype=matmul_dtype_name(core_dtype, device),
        contention=contention,
    )


def _measure(
    case: Case,
    platform: Platform,
    group: ProcessGroup | None,
    libraries: Sequence[Library],
    *,
    first: int = 0,
) -> list[RankResults]:
    """The case measured with each of `libraries` (one: bench run; two: a paired compare, `first` opening
    its timed turns), one RankResults each."""
    # Ranks that fit the host's cores get cores of their own: no migration, no two ranks on one core.
    pinned = platform.device_type == "cpu" and pin_threads(
        local_rank(), local_world_size(), torch.get_num_threads()
    )
    # The contention window: building, warmup and the timed passes (long enough for /proc/stat's ticks).
    load_before, ticks_before, cpu_before = load_average(), cpu_ticks(), time.process_time()
    built = [build_pass(case, platform, group, library) for library in libraries]
    for step, clear_grads, _ in built:
        warm(step, clear_grads, max(0, case.warmup - 1))
    memories = _peak_memories(built, platform)
    samples = time_passes(
        [(step, clear) for step, clear, _ in built], case.repeat, platform, group, first=first
    )
    reading = RankReading(socket.gethostname(), time.process_time() - cpu_before, ticks_before, cpu_ticks())
    load_after = load_average()
    dist.barrier(group)
    core_dtype, device = accumulation_dtype(case.layer.dtype), built[0][2][-1].device
    calibration = _core_gflops(case.layer, core_dtype, device, platform)
    everyone = _gather((samples, memories, calibration, reading, pinned), group)
    contention = judge(
        [r[3] for r in everyone],
        load_before=load_before,
        load_after=load_after,
        pinned=all(r[4] for r in everyone),
    )
    return [
        _side_results(
            everyone,
            side,
            meter=memories[side].meter,
            platform=platform,
            core_dtype=core_dtype,
            device=device,
            contention=contention,
        )
        for side in range(len(libraries))
    ]


def _per_rank(everyone: list, side: int, field: str) -> list[int] | None:
    """[rank] `field` of every rank's memory reading of `side`; None where the meter has none (cpu)."""
    values = [getattr(r[1][side], field) for r in everyone]
    return None if any(v is None for v in values) else values
