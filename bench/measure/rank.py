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
The passes of a round, in order:
1. the first pass, untimed by the case's figures and timed on its own (`first_use_s`: a backend's first use,
   its compiles, autotuning and caches, are in it, never in a timed pass or a memory reading). It is the
   correctness gate (bench.measure.gate): what ran is recorded and checked against the case, its results
   must be finite, and in the case's first round of a run they are fingerprinted and the layer is checked
   on a small input against the fp64 single-device layer. A case that fails is failed, never timed;
2. warmup - 1 more warmup passes (warmup counts the first);
3. in the case's first round of a run, the memory reading (bench.measure.memory: the meter slows the pass,
   which is untimed anyway): the last warmup pass, or one more pass where warmup < 2, so that it is never
   the first;
4. the timed passes.
Then, with the case's tensors freed, each rank's matmul throughput is read (bench.measure.throughput, once
per rank process, its buffers sized to the device's free memory; a reading that does not fit is None, the
timings kept), the limit its achieved GFLOP/s is set against. From building the layer to the last timed
pass each rank records its CPU time and the host's CPU time, steal and load (bench.measure.contention:
whether other processes shared the machine); ranks that fit the host's cores are pinned to cores of their
own first.
"""

from __future__ import annotations

import dataclasses
import gc
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from bench.measure.contention import Contention, RankReading, cpu_ticks, judge, load_average, pin_threads
from bench.measure.gate import (
    CaseCheck,
    CaseCheckError,
    Fingerprints,
    describe_small,
    finite_problems,
    gate_bar,
    ran_problems,
    sketch,
    small_check,
    summed,
    token_rows,
)
from bench.measure.inputs import INPUT, OUTPUT_GRAD, local_ranges, shard_tensor
from bench.measure.library import THIS, Library, load_library
from bench.measure.memory import MemoryReading, measure_peak, tensor_bytes
from bench.measure.throughput import matmul_dtype_name, matmul_gflops
from bench.suite.config import Case
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.distributed import Platform, local_rank, local_world_size, resolve_platform
from gdn_cp.distributed.collectives import group_rank_size
from gdn_cp.dtypes import accumulation_dtype, matmul_precision
from gdn_cp.ops.ran import OpRan, Ran


@dataclass(kw_only=True, slots=True)
class RankMemory:
    """One pass's peak memory on every rank (index = rank): bench.measure.memory's readings."""

    peak_bytes: list[int]
    """[rank] peak allocated bytes of one pass (bench.measure.memory)."""
    baseline_bytes: list[int]
    """[rank] bytes live at the start of that pass."""
    meter: str
    """The memory meter used."""
    device_used_bytes: list[int] | None = None
    """[rank] npu/cuda: the device's used memory after that pass (bench.measure.memory); None on cpu."""
    device_used_before_bytes: list[int] | None = None
    """[rank] npu/cuda: the device's used memory before that pass, the allocator's cache released; None on
    cpu."""
    reserved_peak_bytes: list[int] | None = None
    """[rank] npu/cuda: the allocator's peak reserved bytes during it; None on cpu."""

    @classmethod
    def of(cls, readings: Sequence[MemoryReading]) -> RankMemory:
        """From every rank's reading, in rank order."""

        def per_rank(name: str) -> list[int] | None:
            values = [getattr(r, name) for r in readings]
            return None if any(v is None for v in values) else values

        return cls(
            peak_bytes=[r.peak_bytes for r in readings],
            baseline_bytes=[r.baseline_bytes for r in readings],
            meter=readings[0].meter,
            device_used_bytes=per_rank("device_used_bytes"),
            device_used_before_bytes=per_rank("device_used_before_bytes"),
            reserved_peak_bytes=per_rank("reserved_peak_bytes"),
        )


@dataclass(kw_only=True, slots=True)
class RankResults:
    """What one case measured on every rank (index = rank), identical on all ranks after the gather."""

    samples_s: list[list[float]]
    """[rank][repeat] elapsed seconds of the timed pass."""
    memory: RankMemory | None
    """Peak memory of one pass, read in the case's first round of a run (None in its other rounds)."""
    device_name: str
    """Name of rank 0's device."""
    threads: int
    """torch intra-op threads of rank 0 (every rank gets the same)."""
    matmul_gflops: list[float | None]
    """[rank] the rank's batched-matmul GFLOP/s in the dtype the core's matmuls run in
    (bench.measure.throughput); None where its buffers did not fit in the device's free memory."""
    matmul_dtype: str
    """That dtype, as the matmul runs it (fp32, tf32, bf16, ...)."""
    contention: Contention
    """How shared the machine was during the timed passes (bench.measure.contention)."""
    first_use_s: float = 0.0
    """Rank-max wall time of the first pass, untimed by the case's figures: the backend's first use
    (compiles, autotuning, caches) is in it."""
    ran: list[Ran] | None = None
    """What rank 0's first pass ran (gdn_cp.ops.ran), checked against the case; None where the library
    records nothing (an older gdn_cp in a compare)."""
    check: CaseCheck | None = None
    """The gate's reference checks (bench.measure.gate), in the case's first round of a run."""


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


@dataclass(kw_only=True, slots=True)
class BuiltPass:
    """One case's layer and data on this rank, built with one library (build_pass)."""

    step: Callable[[], torch.Tensor | None]
    """Runs the case's pass once: forward returns the output (its autograd graph lives until the caller drops
    it, as in training before backward), forward_backward and prefill return None."""
    clear_grads: Callable[[], None]
    """Sets every gradient to None."""
    live: list[torch.Tensor]
    """The tensors live between passes: parameters, input shard, output gradient shard."""
    layer: torch.nn.Module
    """The layer under CP."""
    library: Library
    results: Callable[[], dict[str, torch.Tensor | None]]
    """Runs the pass once and keeps what it computed: o (this rank's output shard), input_grad (backward
    passes), state (prefill: the final recurrent states, the same on every rank)."""


def build_pass(
    case: Case, platform: Platform, group: ProcessGroup | None = None, library: Library = THIS
) -> BuiltPass:
    """The case's layer (built with `library`'s gdn_cp: this checkout's unless a paired compare loaded
    another, bench.measure.library) and data on this rank, under the case's CP options."""
    device = platform.device(local_rank())
    # drawn on the CPU: the same weights on any device
    layer = library.seeded_layer(library.config(case.layer), case.seed, device)
    x = _local_shard(case, INPUT, device, group)
    x.requires_grad_(case.pass_ != "prefill")
    # A prefill has no backward: no output gradient is drawn, so none counts in its memory (the training
    # passes keep theirs, as their results always have).
    grad_output = None if case.pass_ == "prefill" else _local_shard(case, OUTPUT_GRAD, device, group)
    cu_seqlens = cu_seqlens_of(case)
    layer = library.style(case.options).apply(layer, group)

    def results() -> dict[str, torch.Tensor | None]:
        if case.pass_ == "prefill":
            with torch.inference_mode():
                o, state = layer.prefill(x, cu_seqlens=cu_seqlens)
            return {"o": o, "state": state.recurrent_state}
        o = layer(x, cu_seqlens=cu_seqlens)
        if case.pass_ == "forward":
            return {"o": o}
        o.backward(grad_output)
        return {"o": o.detach(), "input_grad": x.grad}

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

    return BuiltPass(
        step=step,
        clear_grads=clear_grads,
        live=[*layer.parameters(), x, *([] if grad_output is None else [grad_output])],
        layer=layer,
        library=library,
        results=results,
    )


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
class CaseRound:
    """A case to measure in one round (what `bench run`'s sweep hands the ranks)."""

    case: Case
    first_round: bool = True
    """The case's first round in this run: its gate's reference checks (bench.measure.gate) and its memory
    reading run in this round; every round times the first pass and checks what ran and that it is finite."""

    @property
    def cp(self) -> int:
        return self.case.cp


@dataclass(frozen=True, slots=True)
class PairedCase:
    """A case to measure with two checkouts' gdn_cp in one lifetime (bench.launch.paired), base first."""

    case: Case
    roots: tuple[str, str]
    """The worktrees of base and head (bench.measure.library.load_library)."""
    first: int = 0
    """Which side's pass opens the timed turns (time_passes): 0 base, 1 head; alternated by round."""
    first_round: bool = True
    """As CaseRound.first_round."""

    @property
    def cp(self) -> int:
        return self.case.cp


def measure_on_rank(
    case: Case | CaseRound, device_kind: str, group: ProcessGroup | None = None
) -> RankResults:
    """Time and measure a case (a Case: its first round) on this rank (the function every rank of a launch
    runs), in `group` (the case's CP group; None: the default group, a launch of cp ranks), its matmuls at
    the case's precision."""
    request = case if isinstance(case, CaseRound) else CaseRound(case)
    platform = resolve_platform(device_kind)
    with matmul_precision(request.case.precision, platform.device_type):
        return _measure(request.case, platform, group, [THIS], first_round=request.first_round)[0]


def measure_pair_on_rank(
    paired: PairedCase, device_kind: str, group: ProcessGroup | None = None
) -> list[RankResults]:
    """measure_on_rank with base's and head's gdn_cp in this one process, their timed passes in turn
    (time_passes); [base, head], which share the contention window and the matmul reading."""
    libraries = [load_library(root) for root in paired.roots]
    platform = resolve_platform(device_kind)
    with matmul_precision(paired.case.precision, platform.device_type):
        return _measure(
            paired.case, platform, group, libraries, first=paired.first, first_round=paired.first_round
        )


@dataclass(kw_only=True, slots=True)
class FirstPass:
    """What one side's first pass gave on this rank (`first_pass`)."""

    seconds: float
    """Its wall time on this rank: the backend's first use (compiles, autotuning, caches) is in it."""
    ran: list[Ran] | None
    """What it ran (gdn_cp.ops.ran), None where the library records nothing."""
    check: CaseCheck | None
    """The gate's reference checks, in a case's first round."""


def first_pass(
    case: Case, built: BuiltPass, platform: Platform, group: ProcessGroup | None, *, first_round: bool
) -> FirstPass:
    """The first pass of `built`, untimed by the case's figures and timed on its own: what ran is recorded
    and checked against the case, its results must be finite, and in the first round they are fingerprinted
    and the layer is checked on a small input (bench.measure.gate). CaseCheckError, on every rank alike,
    where a check fails."""
    with built.library.recording() as recording:
        platform.synchronize()
        start = time.perf_counter()
        found = built.results()
        platform.synchronize()
        seconds = time.perf_counter() - start
    _raise_agreed(ran_problems(case, recording, platform.device_type), group, "")
    _raise_agreed(finite_problems(found, group), group, "outputs are not finite: ")
    check = None
    if first_round:
        fingerprints = case_fingerprints(case, found, group)
        del found
        built.clear_grads()
        device = built.live[-1].device
        small = small_check(case, built.layer, platform, group, device)
        _raise_agreed([line] if (line := describe_small(small, gate_bar(case), case)) else [], group, "")
        check = CaseCheck(bar=gate_bar(case), fingerprints=fingerprints, small=small)
    built.clear_grads()
    ran = None if recording is None else [_as_this_ran(call) for call in recording.calls]
    return FirstPass(seconds=seconds, ran=ran, check=check)


def _as_this_ran(call: object) -> Ran:
    """A recorded call of any gdn_cp copy's (a compared ref's own classes) as this checkout's Ran, the fields
    both declare: a copy's objects neither pickle nor validate as this one's."""
    fields = {f.name: getattr(call, f.name) for f in dataclasses.fields(Ran) if hasattr(call, f.name)}
    fields["ops"] = [OpRan(backend=op.backend, op=op.op) for op in fields.get("ops", [])]
    return Ran(**fields)


def _raise_agreed(problems: list[str], group: ProcessGroup | None, prefix: str) -> None:
    """CaseCheckError on every rank if any rank found a problem (rank order, each problem once)."""
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, problems, group=group)
    found = list(dict.fromkeys(p for mine in everyone for p in mine))
    if found:
        more = f" (and {len(found) - 1} more: {'; '.join(found[1:])})" if len(found) > 1 else ""
        raise CaseCheckError(prefix + found[0] + more)


Gathered = tuple[list[list[float]], list[MemoryReading] | None, float | None, RankReading, bool, list[float]]
"""What each rank hands the others: ([side][repeat] seconds, [side] memory or None, matmul GFLOP/s or None,
contention reading, pinned, [side] first pass seconds)."""


def _peak_memories(built: Sequence[BuiltPass], platform: Platform) -> list[MemoryReading]:
    """[side] the peak memory of one pass of each built side on this rank, the other sides' tensors apart."""
    memories = []
    for side, one in enumerate(built):
        # the other sides' tensors are not this side's memory
        others = tensor_bytes(t for i, other in enumerate(built) if i != side for t in other.live)
        memories.append(measure_peak(one.step, platform, one.live, foreign_bytes=others))
        one.clear_grads()
    return memories


def _core_gflops(
    layer: GatedDeltaNetConfig, dtype: torch.dtype, device: torch.device, platform: Platform
) -> float | None:
    """This rank's GFLOP/s of the core's [chunk, head_k_dim] @ [head_k_dim, head_v_dim] in `dtype`, its
    buffers sized to a quarter of the device's free memory; None where even that does not fit (the case's
    timings are kept either way)."""
    free = platform.memory_info(local_rank()) if platform.device_type != "cpu" else None
    try:
        return matmul_gflops(
            layer.chunk_size,
            layer.head_k_dim,
            layer.head_v_dim,
            dtype=dtype,
            device=device,
            platform=platform,
            max_bytes=None if free is None else free[0] // CALIBRATION_SHARE,
        )
    except torch.OutOfMemoryError:
        return None


CALIBRATION_SHARE = 4
"""The calibration's buffers take at most 1/CALIBRATION_SHARE of the device's free memory."""


def _gather(mine: Gathered, group: ProcessGroup | None) -> list[Gathered]:
    """[rank] every rank's Gathered, the same on all ranks (one all_gather_object over `group`)."""
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return everyone


def _side_results(
    everyone: list[Gathered],
    side: int,
    first: FirstPass,
    *,
    platform: Platform,
    core_dtype: torch.dtype,
    device: torch.device,
    contention: Contention,
) -> RankResults:
    """The RankResults of `side` (an index into the libraries) from every rank's Gathered and this rank's
    (rank 0's, for the launch) first pass."""
    memories = None if everyone[0][1] is None else [r[1][side] for r in everyone]
    return RankResults(
        samples_s=[r[0][side] for r in everyone],
        memory=None if memories is None else RankMemory.of(memories),
        device_name=platform.device_name(local_rank()),
        threads=torch.get_num_threads(),
        matmul_gflops=[r[2] for r in everyone],
        matmul_dtype=matmul_dtype_name(core_dtype, device),
        contention=contention,
        first_use_s=max(r[5][side] for r in everyone),
        ran=first.ran,
        check=first.check,
    )


def _measure(
    case: Case,
    platform: Platform,
    group: ProcessGroup | None,
    libraries: Sequence[Library],
    *,
    first: int = 0,
    first_round: bool = True,
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
    firsts = [first_pass(case, b, platform, group, first_round=first_round) for b in built]
    # warmup counts the first pass; the memory is read after it (the last warmup, or one more pass)
    more = max(0, case.warmup - 1)
    for b in built:
        warm(b.step, b.clear_grads, more - 1 if first_round and more else more)
    memories = _peak_memories(built, platform) if first_round else None
    samples = time_passes([(b.step, b.clear_grads) for b in built], case.repeat, platform, group, first=first)
    reading = RankReading(socket.gethostname(), time.process_time() - cpu_before, ticks_before, cpu_ticks())
    load_after = load_average()
    dist.barrier(group)
    core_dtype, device = accumulation_dtype(case.layer.dtype), built[0].live[-1].device
    del built  # the calibration runs on what the case leaves free
    gc.collect()
    if platform.has_allocator_stats:
        platform.empty_cache()
    calibration = _core_gflops(case.layer, core_dtype, device, platform)
    everyone = _gather((samples, memories, calibration, reading, pinned, [f.seconds for f in firsts]), group)
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
            firsts[side],
            platform=platform,
            core_dtype=core_dtype,
            device=device,
            contention=contention,
        )
        for side in range(len(libraries))
    ]


def case_fingerprints(
    case: Case, found: dict[str, torch.Tensor | None], group: ProcessGroup | None
) -> Fingerprints:
    """The fingerprints (bench.measure.gate) of one pass's results on every rank of `group`: the output and
    input gradient shards at their global token positions, the final states (the same on every rank) from
    rank 0 alone."""
    rank, cp = group_rank_size(group)
    rows = token_rows(local_ranges(case.seq_len, cp, rank, case.layout), case.batch, case.seq_len)
    parts = {}
    for name, stream in (("o", 0), ("input_grad", 10)):
        if found.get(name) is not None:
            parts[name] = sketch(found[name], rows, stream)
    state = found.get("state")
    if state is not None:
        states = torch.arange(state.numel() // state.shape[-1])
        part = sketch(state, states, 20)
        parts["state"] = part if rank == 0 else torch.zeros_like(part)
    return summed(parts, group)
