"""A rough estimate of a case's peak memory per rank, and the memory available to it, for validation.

Only used to refuse, before any rank starts, a case that cannot fit; the measured number is
bench.measure.memory's.

Formula (bytes per rank). tokens = batch * seq_len / cp (ulysses holds all tokens of Hv/cp heads instead:
the same amount), padded = batch * (seq_len / cp rounded up to a multiple of C): the chunked op pads the
shard to whole chunks, so each of its N chunks holds C tokens and C x C matrices (ulysses pads the whole
sequence instead, which this overestimates only when C exceeds the shard); in the zigzag layout each of the
rank's two pieces is padded on its own. Packed documents add nothing: the layer keeps them apart with masks
inside shared chunks (gdn_cp.ops.documents, resets), so they pad nothing; e = bytes per element of the
dtype, a = of the accumulation dtype (4; 8 for fp64), P = parameter count, conv_dim = 2*Hk*K + Hv*V,
value_dim = Hv*V, state = Hv*K*(V + K) (one packed [S | M]). The local path is the mode's
(CPMode.local_path: "whole" for ulysses; for the summary modes "kcp" / "kcp-kept" on a backend with a
summaries-then-outputs pair (gdn_cp, fla) with checkpoint on / off, "recompute" / "affine" on another,
"split" with overlap):

    peak = e*P                                              parameters
         + 2 * e * tokens * hidden                          input shard and output gradient
         + padded * F[path] * a*Hv*(3K + V + C)             the op's saved tensors and working set per token
                                                            (q, k_tail, w, u: [C, K] or [C, V] per chunk;
                                                            the [C, C] UT transform and masked Q K^T)
         + WORKSPACE[path] * a * state                      the op's workspace that does not grow with
                                                            tokens (its V + K call's on the affine path);
                                                            F and WORKSPACE per path: OP_FACTOR,
                                                            WORKSPACE_STATES
         + tokens * 2.5 * e*(2*conv_dim + 3*value_dim + hidden)   projections, conv out, z, o, norm, output
         + [split, checkpoint off] tokens * 3 * a * state / C     the per-chunk summary graph
         + held * batch * a * state                        the summaries of other ranks the mode holds
                                                           (CPMode.held_summaries: all_gather cp, others 0;
                                                           one per piece: x2 in the zigzag layout)
         + [split] padded * F * a*Hv*K*(1 + K / C)          the output scan's extra K columns: q_eff per token
                                                           and the identity's part of each chunk state
         + [forward_backward] e*P + e*tokens*hidden         parameter and input gradients
         + [forward_backward] padded * F_bwd[path] * a*Hv*(3K + V + C)   what the op's backward adds

Fitted to gdn_cp's ops on CPU with the profiler meter at the reference PR's per-rank shape (hidden 2048,
K/V heads 16/32, head dims 128, bf16, cp 2, 2K to 16K tokens per rank; scenario cpu-memory, README
"Memory"): every measured peak lies under the estimate, by 1.05-1.21x at 8K tokens per rank for every mode
and checkpoint (the tests hold those figures). Off the CPU the allocator's rounding and a device's
workspaces add to it: the device's own reading (device_used_bytes) is the one to trust there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bench.launch.devices import probe_devices
from bench.suite.config import Case
from gdn_cp.distributed import Platform, mode_class
from gdn_cp.distributed.layout import pieces_per_rank
from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.ops import get_backend

ACTIVATION_FACTOR = 2.5
"""Live activation bytes per token, relative to the main tensors a step creates (fitted, see above)."""
OP_FACTOR = {"whole": 2.5, "split": 5.0, "kcp": 2.0, "kcp-kept": 3.0, "recompute": 2.0, "affine": 2.0}
"""F[path]: the op's bytes per token, relative to its chunk intermediates (fitted, see above). The kcp
path keeps what one fused call keeps (inputs, UT transforms, a state per block) and, unlike ulysses' whole
sequence, its backward's working set is one block's; kcp-kept and split keep every prepared chunk, and split
its scan at width V + K too (fitted at 2K tokens per rank: 1408 / 1656 MiB with the checkpoint on / off)."""
BACKWARD_OP_FACTOR = {"kcp-kept": 1.5}
"""F_bwd[path]: what a backward adds per token on top of F[path], relative to the chunk intermediates: the
kcp-kept path's backward differentiates every kept chunk at once (their gradients, a second set); the other
paths' backward works block by block or within what F counts (fitted, see above)."""
WORKSPACE_STATES = {"whole": 16, "split": 16, "kcp": 16, "kcp-kept": 16, "recompute": 16, "affine": 72}
"""WORKSPACE[path]: the op's memory that does not grow with tokens, in packed states (fitted, see above)."""
SUMMARY_GRAPH_FACTOR = 3.0
"""Per-chunk summary tensors kept for backward without the summary checkpoint, relative to one (S, M)."""


def parameter_count(case: Case) -> int:
    """Parameters of one GatedDeltaNet layer (gdn_cp.layers.GatedDeltaNet)."""
    c = case.layer
    return (
        c.hidden_size * (c.conv_dim + c.value_dim + 2 * c.num_v_heads)  # in_proj_qkv, in_proj_z, in_proj_b/a
        + c.conv_dim * c.conv_kernel_size  # conv1d
        + 2 * c.num_v_heads  # dt_bias, A_log
        + c.head_v_dim  # norm
        + c.value_dim * c.hidden_size  # out_proj
    )


def padded_tokens(case: Case) -> int:
    """Tokens per rank the chunked op works on: each of the rank's pieces of a sequence (one contiguous, two
    zigzag) rounded up to whole chunks. Packed documents share chunks, so they pad nothing."""
    C = case.layer.chunk_size
    pieces = pieces_per_rank(case.layout)
    piece = case.local_seq_len // pieces  # zigzag's pieces are equal (preflight checks the split)
    return case.batch * pieces * -(-piece // C) * C


def estimate_peak_bytes(case: Case) -> int:
    """Rough peak allocated bytes per rank of one pass of `case` (formula in the module docstring)."""
    c = case.layer
    dtype = case.layer.dtype
    e = dtype.itemsize
    a = accumulation_dtype(dtype).itemsize
    Hv, K, V, C = c.num_v_heads, c.head_k_dim, c.head_v_dim, c.chunk_size
    tokens = case.batch * case.local_seq_len
    params = parameter_count(case)
    summary = Hv * K * (K + V)  # elements of one packed [S | M]

    mode = mode_class(case.mode)
    path = mode.local_path(case.options, get_backend(case.backend))
    peak = e * params + 2 * e * tokens * c.hidden_size
    peak += padded_tokens(case) * OP_FACTOR[path] * a * Hv * (3 * K + V + C)
    peak += WORKSPACE_STATES[path] * a * summary
    peak += tokens * ACTIVATION_FACTOR * e * (2 * c.conv_dim + 3 * c.value_dim + c.hidden_size)
    if path == "split" and not case.checkpoint:
        peak += tokens * SUMMARY_GRAPH_FACTOR * a * summary / C
    if path == "split":
        peak += padded_tokens(case) * OP_FACTOR[path] * a * Hv * K * (1 + K / C)
    held = mode.held_summaries(case.cp) * pieces_per_rank(case.layout)  # a summary per piece
    peak += held * case.batch * a * summary
    if case.pass_ == "forward_backward":
        peak += e * params + e * tokens * c.hidden_size
        peak += padded_tokens(case) * BACKWARD_OP_FACTOR.get(path, 0.0) * a * Hv * (3 * K + V + C)
    # prefill: the forward's figure, an upper bound (inference mode keeps no activations for a backward)
    return int(peak)


def human_bytes(n: float) -> str:
    """1536 MiB -> "1.5 GiB", 12 MiB -> "12.0 MiB": sizes in messages."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def host_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Memory the host can still give (MemAvailable), or free pages from sysconf; None if unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the value is in kB
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


@dataclass(frozen=True, slots=True)
class AvailableMemory:
    """What the ranks of a case can allocate on this host."""

    host: int | None = None
    """cpu: the host's available bytes, which every local rank draws on (None: unknown)."""
    devices: tuple[int, ...] = ()
    """Accelerators: the free bytes of each device the ranks take, in the order they take them (a local
    launch puts its rank r on device r; a torchrun rank holds its own device alone)."""

    def for_ranks(self, ranks: int) -> tuple[int | None, int]:
        """(bytes available, how many of a case's `ranks` ranks on this host draw on them): on a cpu the
        host's memory shared by all; on devices the least free of the `ranks` first, one rank each (another
        job on a device the case does not take changes nothing)."""
        if self.devices:
            return min(self.devices[:ranks]), 1
        return self.host, ranks


def available_memory(platform: Platform, local_rank: int | None = None) -> AvailableMemory:
    """What the ranks can allocate (AvailableMemory). cpu: the host's available memory. npu/cuda: a
    launcher (`local_rank` None) reads every local device's free memory from a probe process, so that it
    creates no device context (bench.launch.devices.probe_devices); a torchrun rank its own device's,
    which it chooses first."""
    if platform.device_type == "cpu":
        return AvailableMemory(host=host_available_bytes())
    if local_rank is not None:
        platform.set_device(local_rank)
        info = platform.memory_info(local_rank)
        return AvailableMemory(devices=() if info is None else (info[0],))
    return AvailableMemory(devices=tuple(d.free_bytes for d in probe_devices(platform)))
