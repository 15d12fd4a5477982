"""The chunked GDN in pieces, for context parallelism: `prepare_chunks` (stage 1, the UT transform, once
per rank), then the outputs when the entering states are known (`chunk_outputs`, stage 2), or split so that
most of stage 2 runs while they are in flight (`split_chunk_outputs`, finished by
`SplitOutputs.with_entering_states`). A rank prepares once, summarises (gdn_cp.ops.summary), and scans.
`summarise_chunks` is the other way: the summaries of some segments without outputs, then the outputs at
width V with one backward (gdn_cp.ops.chunk.deferred, FLA's KCP).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gdn_cp.ops.chunk.deferred import (
    FusedOutputs,
    FusedSummary,
    Link,
    PreparedOutputs,
    PreparedSummary,
    fused_summaries,
)
from gdn_cp.ops.chunk.intermediates import ChunkInputs, ChunkIntermediates, Prepared
from gdn_cp.ops.chunk.layout import (
    check_resets,
    check_state_shape,
    chunked_inputs,
    outputs,
    segment_results,
    segment_states,
)
from gdn_cp.ops.chunk.prepare import PrepareChunks, check_chunk_size
from gdn_cp.ops.chunk.scan import ChunkScan
from gdn_cp.ops.documents import ChunkGrid, check_packed_batch, document_bounds
from gdn_cp.ops.inputs import check_gdn_inputs


def prepare_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
    resets: Sequence[int] = (),
) -> ChunkIntermediates:
    """Split the sequence into chunks of `chunk_size` and compute their state-independent intermediates.

    T need not be a multiple of chunk_size: the tail is padded with g = 0 and beta = 0, which leaves the
    state untouched.

    Args:
        q, k, v, g, beta, scale, use_qk_l2norm_in_kernel: as the op's (gdn_cp.ops.backends.RuleOp)
        chunk_size: C
        cu_seqlens: [n + 1] boundaries of n segments (0 < ... < T) that share no state, the same in every
            batch row (unlike `chunk_gated_delta_rule`, B may exceed 1 here: a context-parallel rank cuts its
            shard at its pieces' edges); None: one segment
        resets: token positions where the state restarts from zeros inside a segment (documents without
            states of their own; a reset at a segment's first token discards its entering state); they share
            chunks, kept apart by masks, so they cost no padding
    Returns:
        ChunkIntermediates with one chunk grid in which no chunk spans two segments.
    """
    check_gdn_inputs(q, k, v, g, beta)
    check_chunk_size(chunk_size)
    bounds = None if cu_seqlens is None else document_bounds(cu_seqlens, q.shape[1])
    check_resets(resets, q.shape[1])
    x = chunked_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, chunk_size, bounds, resets)
    p = Prepared(*PrepareChunks.apply(*x.inputs(), x.grid.masks))
    return ChunkIntermediates(
        q_decayed=p.q_decayed,
        k_tail_grouped=p.k_tail,
        w_grouped=p.w,
        u_grouped=p.u,
        attn_grouped=p.attn,
        decay_grouped=p.decay,
        seq_len=x.seq_len,
        dtype=q.dtype,
        grid=x.grid,
        per_segment=cu_seqlens is not None,
    )


def chunk_outputs(
    chunks: ChunkIntermediates,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Outputs of prepared chunks given the state entering every segment.

    Args:
        chunks: from `prepare_chunks`
        initial_state: [B, Hv, K, V] (prepared without cu_seqlens) or [B, n, Hv, K, V] (one per segment), or
            None (zeros)
        output_final_state: also return the state after every segment
    Returns:
        o [B, T, Hv, V] in the inputs' dtype; final state(s), shaped like initial_state, in the accumulation
        dtype, or None.
    """
    w, u = chunks.w_grouped, chunks.u_grouped
    B, Hk, G, K, V = (*w.shape[:3], w.shape[-1], u.shape[-1])
    n = chunks.grid.num_segments
    expected = (B, n, Hk * G, K, V) if chunks.per_segment else (B, Hk * G, K, V)
    check_state_shape(initial_state, expected, "[B, n, Hv, K, V]" if chunks.per_segment else "[B, Hv, K, V]")
    h0 = segment_states(initial_state, u, n, K)
    o, final = ChunkScan.apply(*chunks.prepared, h0, chunks.grid)
    final = segment_results(final, chunks.per_segment) if output_final_state else None
    return outputs(o, chunks.seq_len, chunks.grid, chunks.dtype), final


@dataclass(frozen=True, slots=True)
class SplitOutputs:
    """Outputs of prepared chunks split by what they need of the states entering the segments: the part
    computed from the segments' fresh states alone (`free`) and the linear map of the entering states
    (`q_eff`), so that o = free + q_eff H_in and final = final_free + final_map H_in for the H_in of each
    token's segment. The CP modes compute it while H_in is in flight (`split_chunk_outputs`) and finish with
    `with_entering_states` once it has arrived.

    q_eff is the output the chunk scan gives from the identity: for a segment entered with H, every chunk
    state is Phi_n H (Phi_n the product of the chunk maps before chunk n), so o_n = (Qg - P W) Phi_n H.
    Tensors are in the accumulation dtype, [B, Hk, G, ...] grouped like ChunkIntermediates.
    """

    free: torch.Tensor
    """[B, Hk, G, N, C, V]"""
    q_eff: torch.Tensor
    """[B, Hk, G, N, C, K]"""
    final_free: torch.Tensor
    """[B, Hk, G, n, K, V]: each segment's leaving state from its fresh state."""
    final_map: torch.Tensor
    """[B, Hk, G, n, K, K]: M of each segment (zero where a segment does not read H_in)."""
    seq_len: int
    dtype: torch.dtype
    grid: ChunkGrid
    per_segment: bool

    def with_entering_states(
        self, entering: torch.Tensor, output_final_state: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(o [B, T, Hv, V] in the inputs' dtype, final state(s) or None) given the state entering every
        segment: entering [B, n, Hv, K, V] (per segment) or [B, Hv, K, V], like `chunk_outputs`'
        initial_state."""
        K = self.q_eff.shape[-1]
        h = segment_states(entering, self.free, self.grid.num_segments, K)  # [B, Hk, G, n, K, V]
        o = self.free + self.q_eff @ h.index_select(3, self.grid.chunk_segments(h.device))
        final = None
        if output_final_state:
            final = segment_results(self.final_free + self.final_map @ h, self.per_segment)
        return outputs(o, self.seq_len, self.grid, self.dtype), final


def split_chunk_outputs(
    chunks: ChunkIntermediates,
    fresh_state: torch.Tensor | None = None,
    carried: torch.Tensor | None = None,
) -> SplitOutputs:
    """The outputs of prepared chunks, before the states entering their segments are known (SplitOutputs).

    One chunk scan of width V + K: U extended by K zero columns, each segment entered with [fresh | I] (its
    fresh state and the identity), so the first V columns are the outputs from the fresh states and the last K
    the map of H_in (the scan is linear in the entering state). About twice a plain scan's work.

    Args:
        chunks: from `prepare_chunks`
        fresh_state: like `chunk_outputs`' initial_state ([B, Hv, K, V] or [B, n, Hv, K, V]): what a segment
            that does not read H_in starts from; None: zeros
        carried: [n] bool, which segments read H_in (their fresh state is then ignored); None: all
    """
    w, u = chunks.w_grouped, chunks.u_grouped
    B, Hk, G, K, V = (*w.shape[:3], w.shape[-1], u.shape[-1])
    grid = chunks.grid
    n = grid.num_segments
    expected = (B, n, Hk * G, K, V) if chunks.per_segment else (B, Hk * G, K, V)
    check_state_shape(fresh_state, expected, "[B, n, Hv, K, V]" if chunks.per_segment else "[B, Hv, K, V]")
    carried = torch.ones(n, dtype=torch.bool, device=u.device) if carried is None else carried.to(u.device)
    keep = carried.view(1, 1, 1, n, 1, 1)
    fresh = torch.where(keep, 0.0, segment_states(fresh_state, u, n, K))
    eye = torch.eye(K, dtype=u.dtype, device=u.device).expand(B, Hk, G, n, K, K)
    h0 = torch.cat([fresh, torch.where(keep, eye, 0.0)], dim=-1)
    u_ext = torch.cat([u, u.new_zeros(*u.shape[:-1], K)], dim=-1)
    o, final = ChunkScan.apply(*chunks.prepared._replace(u=u_ext), h0, grid)
    return SplitOutputs(
        free=o[..., :V],
        q_eff=o[..., V:],
        final_free=final[..., :V],
        final_map=final[..., V:],
        seq_len=chunks.seq_len,
        dtype=chunks.dtype,
        grid=grid,
        per_segment=chunks.per_segment,
    )


@dataclass(frozen=True, slots=True)
class SummarisedChunks:
    """The packed maps [S | M] of some segments, taken before the states entering the segments are known, and
    what computes the outputs once they are (`with_entering_states`), with one backward at width V
    (gdn_cp.ops.chunk.deferred: FLA's KCP in the chunk stages). From `summarise_chunks`."""

    summaries: torch.Tensor
    """[B, m, Hv, K, V + K] in the accumulation dtype: each summarised segment's map of its entering state
    (M = 0 where it was not wanted, S then from the segment's fresh state)."""
    inputs: tuple[torch.Tensor, ...]
    """What the outputs' Function takes: the chunked inputs (recompute) or the prepared intermediates."""
    fresh: torch.Tensor | None
    """[B, Hk, G, n, K, V]: what the segments that are not carried enter with (None: zeros)."""
    link: Link
    recompute: bool
    seq_len: int
    dtype: torch.dtype

    def with_entering_states(
        self, entering: torch.Tensor, output_final_state: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(o [B, T, Hv, V] in the inputs' dtype, each segment's final state [B, n, Hv, K, V] or None), given
        entering [B, n, Hv, K, V]: the state entering each carried segment (ignored at the others, whose
        gradient it gets as exact zeros, so that it stays in the graph)."""
        like = self.inputs[3] if not self.recompute else self.inputs[2]  # U or v: [B, Hk, G, N, C, V]
        n, K = self.link.grid.num_segments, entering.shape[-2]
        h = segment_states(entering, like, n, K)
        base = torch.zeros_like(h) if self.fresh is None else self.fresh
        h_start = torch.where(self.link.carried_mask(h.device), h, base)
        function = FusedOutputs if self.recompute else PreparedOutputs
        o, final = function.apply(*self.inputs, h_start, self.link)
        final = segment_results(final, per_segment=True) if output_final_state else None
        return outputs(o, self.seq_len, self.link.grid, self.dtype), final


def summarise_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    carried: Sequence[bool],
    summarised: Sequence[int],
    maps: Sequence[bool] | None = None,
    resets: Sequence[int] = (),
    fresh_state: torch.Tensor | None = None,
    recompute: bool = True,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> SummarisedChunks:
    """The packed [S | M] of the `summarised` segments, without their outputs, and the outputs to follow once
    the entering states are known (SummarisedChunks.with_entering_states): FLA's KCP in the chunk stages
    (gdn_cp.ops.chunk.deferred). Its backward is one backward at width V, after KCP's pre-pass: the gradient
    of the summaries is read as dS only (dM = dS H_in^T, which holds wherever (S, M) is used as M H_in + S).

    Args:
        q, k, v, g, beta: as the op's (gdn_cp.ops.backends.RuleOp)
        cu_seqlens: [n + 1] segment boundaries 0 < ... < T, the same in every batch row; each segment in
            chunks of its own
        carried: [n] which segments enter with the state given to with_entering_states (the others with
            fresh_state)
        summarised: the segments whose map is taken, in the order of `summaries`
        maps: per summarised segment, whether its M is wanted (a chain at width V + K from [0 | I]); else
            M = 0 and S is its leaving state from its fresh state (width V). Default: where carried
        resets: token positions where the state restarts inside a segment (documents without states of
            their own; a summarised segment with one inside must not ask for M, which is 0)
        fresh_state: [B, n, Hv, K, V] what the segments that are not carried enter with; None: zeros
        recompute: keep what the fused op keeps and recompute the rest in backward (less memory); else keep
            the prepared intermediates and the chunk states (less work)
        scale, use_qk_l2norm_in_kernel, chunk_size: as the op's
    """
    check_gdn_inputs(q, k, v, g, beta)
    check_chunk_size(chunk_size)
    bounds = document_bounds(cu_seqlens, q.shape[1])
    n = len(bounds) - 1
    if len(carried) != n:
        raise ValueError(f"{len(carried)} carried flags for {n} segments: give one per segment")
    maps = tuple(carried[j] for j in summarised) if maps is None else tuple(maps)
    if len(maps) != len(summarised):
        raise ValueError(f"{len(maps)} maps flags for {len(summarised)} summarised segments: give one each")
    check_resets(resets, q.shape[1])
    x = chunked_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, chunk_size, bounds, resets)
    link = Link(x.grid, tuple(bool(c) for c in carried), tuple(summarised), maps)
    K = q.shape[-1]
    fresh = None
    if fresh_state is not None:
        check_state_shape(fresh_state, (q.shape[0], n, v.shape[2], K, v.shape[3]), "[B, n, Hv, K, V]")
        fresh = segment_states(fresh_state, x.v, n, K)
    q_c, k_c, v_c, gamma, beta_c = x.inputs()
    chunked = (q_c.contiguous(), k_c.contiguous(), v_c, gamma, beta_c)
    if recompute:
        inputs = chunked
        packed = FusedSummary.apply(*inputs, fresh, link) if summarised else None
    else:
        inputs = tuple(PrepareChunks.apply(*chunked, x.grid.masks))
        packed = PreparedSummary.apply(*inputs, fresh, link) if summarised else None
    if packed is None:
        B, Hv, V = q.shape[0], v.shape[2], v.shape[3]
        summaries = x.v.new_zeros(B, 0, Hv, K, V + K)
    else:
        summaries = segment_results(packed, per_segment=True)
    return SummarisedChunks(summaries, inputs, fresh, link, recompute, x.seq_len, q.dtype)


def chunk_state_maps(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Backend gdn_cp's summary hook (gdn_cp.ops.backends.SummaryOp): the packed map [S | M] of each
    sequence, the chunk chain of the state at width V + K from [0 | I] block by block over the prepared
    intermediates (gdn_cp.ops.chunk.deferred), no output scan and no graph.

    Shapes as `chunk_gated_delta_rule`'s (cu_seqlens: B = 1); returns [N, Hv, K, V + K] in the accumulation
    dtype, N = B or the n sequences of cu_seqlens.
    """
    check_gdn_inputs(q, k, v, g, beta)
    check_chunk_size(chunk_size)
    bounds = None
    if cu_seqlens is not None:
        check_packed_batch(q.shape[0])
        bounds = document_bounds(cu_seqlens, q.shape[1])
    with torch.no_grad():
        x = chunked_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, chunk_size, bounds)
        n = x.grid.num_segments
        link = Link(x.grid, (True,) * n, tuple(range(n)), (True,) * n)
        q_c, k_c, *rest = x.inputs()
        packed, _ = fused_summaries(ChunkInputs(q_c.contiguous(), k_c.contiguous(), *rest), link)
    maps = segment_results(packed, per_segment=True)  # [B, n, Hv, K, V + K]
    return maps[0] if bounds is not None else maps[:, 0]
