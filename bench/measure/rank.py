"""What every rank of a case runs: build the CP layer, time the pass, measure its memory, gather to all ranks.

Runs inside an initialised process group, in the case's CP group: the default group of a pool of local
ranks (bench.launch.pool), or a group of its own inside a torchrun job (bench.launch.job). Every rank
builds the same weights, the same global input and the same output gradient from the case's seed, keeps
its sequence shard in the case's layout (shard_sequence: contiguous or zigzag), and puts the layer under
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
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from bench.measure.contention import Contention, RankReading, cpu_ticks, judge, load_average, pin_threads
from bench.measure.memory import measure_peak
from bench.measure.throughput import matmul_dtype_name, matmul_gflops
from bench.suite.config import Case
from gdn_cp import LinearAttentionContextParallel
from gdn_cp.distributed import Platform, local_rank, local_world_size, resolve_platform, shard_sequence
from gdn_cp.dtypes import accumulation_dtype, matmul_precision
from gdn_cp.layers import seeded_layer


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


def global_tensor(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """The same tensor on every rank: drawn on the CPU from a seeded generator (device RNGs differ)."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)


def _local_shard(
    x: torch.Tensor, device: torch.device, layout: str, group: ProcessGroup | None
) -> torch.Tensor:
    """This rank's shard of x [B, T, hidden] in `layout`, [B, T/cp, hidden], as its own tensor on `device`
    (a copy, so that the global tensor can be freed)."""
    return shard_sequence(x, group, layout=layout).to(device, copy=True)


def cu_seqlens_of(case: Case) -> torch.Tensor | None:
    """[n + 1] int64 global document boundaries of the case (None: unpacked), the same on every rank. On the
    host: the layer reads them as Python ints, so a device copy would only add a synchronisation."""
    bounds = case.cu_seqlens()
    return None if bounds is None else torch.tensor(bounds, dtype=torch.long)


def build_pass(
    case: Case, platform: Platform, group: ProcessGroup | None = None
) -> tuple[Callable[[], torch.Tensor | None], Callable[[], None], list[torch.Tensor]]:
    """The case's layer and data on this rank; returns (step, clear_grads, live tensors).

    `step()` runs the case's pass once: forward returns the output (its autograd graph lives until the caller
    drops it, as in training before backward), forward_backward and prefill return None. `clear_grads()` sets
    every gradient to None.
    """
    device = platform.device(local_rank())
    config = case.layer
    layer = seeded_layer(config, case.seed, device)  # drawn on the CPU: the same weights on any device
    generator = torch.Generator().manual_seed(case.seed + 1)
    shape = (case.batch, case.seq_len, case.layer.hidden_size)
    x = _local_shard(global_tensor(shape, config.dtype, generator), device, case.layout, group)
    x.requires_grad_(case.pass_ != "prefill")
    # A prefill has no backward: no output gradient is drawn, so none counts in its memory (the training
    # passes keep theirs, as their results always have).
    grad_output = (
        None
        if case.pass_ == "prefill"
        else _local_shard(global_tensor(shape, config.dtype, generator), device, case.layout, group)
    )
    cu_seqlens = cu_seqlens_of(case)
    style = LinearAttentionContextParallel(
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


def time_pass(
    step: Callable[[], torch.Tensor | None],
    clear_grads: Callable[[], None],
    case: Case,
    platform: Platform,
    *,
    warmup: int,
    group: ProcessGroup | None = None,
) -> list[float]:
    """`warmup` untimed passes, then `case.repeat` timed passes on this rank; elapsed seconds per repeat."""
    warm(step, clear_grads, warmup)
    samples = []
    for _ in range(case.repeat):
        dist.barrier(group)
        platform.synchronize()
        start = time.perf_counter()
        out = step()
        platform.synchronize()
        samples.append(time.perf_counter() - start)
        del out  # a forward's graph is freed after the stop: tearing it down is not part of the pass
        clear_grads()
    return samples


def measure_on_rank(case: Case, device_kind: str, group: ProcessGroup | None = None) -> RankResults:
    """Time and measure `case` on this rank (the function every rank of a launch runs), in `group` (the
    case's CP group; None: the default group, a launch of cp ranks), its matmuls at the case's precision."""
    platform = resolve_platform(device_kind)
    with matmul_precision(case.precision, platform.device_type):
        return _measure(case, platform, group)


def _measure(case: Case, platform: Platform, group: ProcessGroup | None) -> RankResults:
    # Ranks that fit the host's cores get cores of their own: no migration, no two ranks on one core.
    pinned = platform.device_type == "cpu" and pin_threads(
        local_rank(), local_world_size(), torch.get_num_threads()
    )
    # The contention window: building, warmup and the timed passes (long enough for /proc/stat's ticks).
    load_before, ticks_before, cpu_before = load_average(), cpu_ticks(), time.process_time()
    step, clear_grads, live = build_pass(case, platform, group)
    warm(step, clear_grads, max(0, case.warmup - 1))
    memory = measure_peak(step, platform, live)  # the last warmup pass (module docstring)
    clear_grads()
    samples = time_pass(step, clear_grads, case, platform, warmup=0, group=group)
    reading = RankReading(socket.gethostname(), time.process_time() - cpu_before, ticks_before, cpu_ticks())
    load_after = load_average()
    dist.barrier(group)
    layer = case.layer
    core_dtype, device = accumulation_dtype(layer.dtype), live[-1].device
    calibration = matmul_gflops(
        layer.chunk_size,
        layer.head_k_dim,
        layer.head_v_dim,
        dtype=core_dtype,
        device=device,
        platform=platform,
    )
    mine = (
        samples,
        memory.peak_bytes,
        memory.baseline_bytes,
        calibration,
        reading,
        pinned,
        memory.device_used_bytes,
    )
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return RankResults(
        samples_s=[r[0] for r in everyone],
        peak_bytes=[r[1] for r in everyone],
        baseline_bytes=[r[2] for r in everyone],
        device_used_bytes=None if memory.device_used_bytes is None else [r[6] for r in everyone],
        meter=memory.meter,
        device_name=platform.device_name(local_rank()),
        threads=torch.get_num_threads(),
        matmul_gflops=[r[3] for r in everyone],
        matmul_dtype=matmul_dtype_name(core_dtype, device),
        contention=judge(
            [r[4] for r in everyone],
            load_before=load_before,
            load_after=load_after,
            pinned=all(r[5] for r in everyone),
        ),
    )
