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
value_dim = Hv*V:

    peak = e*P                                              parameters
         + 2 * e * tokens * hidden                          input shard and output gradient
         + padded * 2.5 * a*Hv*(3K + V + C)                 chunk intermediates q, k_tail, w, u ([C, K] or
                                                            [C, V] per chunk) and the [C, C] UT transform
                                                            and masked Q K^T: N*C*C per head
         + tokens * 2.5 * e*(2*conv_dim + 3*value_dim + hidden)   projections, conv out, z, o, norm, output
         + [checkpoint off, a mode with a summary] tokens * 3 * a * Hv*K*(K + V) / C   per-chunk summary graph
         + held * batch * a * Hv*K*(K + V)                 the summaries of other ranks the mode holds
                                                           (CPMode.held_summaries: all_gather cp, others 0;
                                                           one per piece: x2 in the zigzag layout)
         + [overlap] padded * 2.5 * a*Hv*K*(1 + K / C)     the output scan's extra K columns: q_eff per token
                                                           and the identity's part of each chunk state
         + [forward_backward] e*P + e*tokens*hidden         parameter and input gradients

The factors 2.5 and 3 are fitted to gdn_cp's eager ops on CPU with the profiler meter (fp32, head dims
32-128, chunk 32-64: within about 10% of the measured forward peak; forward_backward peaks at the end of
the forward, about the same). The PR's eager NPU implementation measured about twice this at its shapes
(5289 MiB for p2p at CP4/32K, hidden 2048, bf16, where this gives about 2.9 GiB): treat it as a lower bound
off CPU, which is what refusing a case that cannot fit needs.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.suite.config import Case
from gdn_cp.distributed import Platform, mode_class, probe_devices
from gdn_cp.distributed.layout import pieces_per_rank
from gdn_cp.dtypes import accumulation_dtype

ACTIVATION_FACTOR = 2.5
"""Live activation bytes per token, relative to the main tensors a step creates (fitted, see above)."""
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

    peak = e * params + 2 * e * tokens * c.hidden_size
    peak += padded_tokens(case) * ACTIVATION_FACTOR * a * Hv * (3 * K + V + C)
    peak += tokens * ACTIVATION_FACTOR * e * (2 * c.conv_dim + 3 * c.value_dim + c.hidden_size)
    mode = mode_class(case.mode)
    if mode.has_summary and not case.checkpoint:
        peak += tokens * SUMMARY_GRAPH_FACTOR * a * summary / C
    if mode.has_summary and case.overlap:
        peak += padded_tokens(case) * ACTIVATION_FACTOR * a * Hv * K * (1 + K / C)
    held = mode.held_summaries(case.cp) * pieces_per_rank(case.layout)  # a summary per piece
    peak += held * case.batch * a * summary
    if case.pass_ == "forward_backward":
        peak += e * params + e * tokens * c.hidden_size
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


def available_bytes(platform: Platform, local_rank: int | None = None) -> tuple[int | None, bool]:
    """(bytes available to the ranks, shared_by_local_ranks).

    cpu: the host's available memory, shared by every local rank. npu/cuda: a launcher (`local_rank`
    None) takes the least free memory of this host's devices, read by a probe process so that it creates no
    device context (gdn_cp.distributed.launch.probe_devices); a torchrun rank its own device's, which it
    chooses first.
    """
    if platform.device_type == "cpu":
        return host_available_bytes(), True
    if local_rank is not None:
        platform.set_device(local_rank)
        info = platform.memory_info(local_rank)
        return (info[0] if info is not None else None), False
    devices = probe_devices(platform)
    return (min(d.free_bytes for d in devices) if devices else None), False
