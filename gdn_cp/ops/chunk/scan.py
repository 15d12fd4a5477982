"""Stage 2 of the chunked GDN, the chunk scan (FLA's chunk_delta_h and chunk_o in one loop): the prepared
intermediates and an entering state -> the outputs and the leaving state; the backward is the reverse chunk
scan for dH (dH = Qg^T dO + e^gamma_C dH' - W^T dv_new) and batched formulas for everything else.

Segments (packed documents): the scan enters a segment's first chunk with that segment's initial state and
writes the state leaving its last chunk as the segment's final state; the backward mirrors both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn_cp.ops.chunk.intermediates import Prepared
from gdn_cp.ops.documents import ChunkGrid


@dataclass(frozen=True, slots=True)
class BlockSegments:
    """The segments (documents) seen by one scan over a block of chunks: `starts` / `ends` map a chunk of the
    block to the segment it starts / ends; `initial` and `final` are [B, Hk, G, n, K, V], the segments'
    entering and leaving states (their gradients in a backward scan)."""

    starts: dict[int, int]
    ends: dict[int, int]
    initial: torch.Tensor
    final: torch.Tensor | None


def block_segments(
    grid: ChunkGrid, lo: int, hi: int, initial: torch.Tensor, final: torch.Tensor
) -> BlockSegments:
    return BlockSegments(grid.segment_starts(lo, hi), grid.segment_ends(lo, hi), initial, final)


def scan_states(
    k_tail: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    decay: torch.Tensor,
    h: torch.Tensor,
    segments: BlockSegments,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(states entering each chunk [..., N, K, V], v_new [..., N, C, V], the state leaving the last chunk).

    h: the state entering the first chunk when it does not start a segment. A chunk that starts segment j
    enters with segments.initial[..., j] instead; the state leaving segment j's last chunk is written to
    segments.final[..., j]. Runs inside autograd Functions (no graph), so results go straight into
    preallocated tensors.
    """
    N = u.shape[3]
    states = h.new_empty(*h.shape[:3], N, *h.shape[3:])
    v_new = torch.empty_like(u)
    for n in range(N):
        if n in segments.starts:
            h = segments.initial[:, :, :, segments.starts[n]]
        states[:, :, :, n] = h
        torch.sub(u[:, :, :, n], w[:, :, :, n] @ h, out=v_new[:, :, :, n])
        h = decay[:, :, :, n, None, None] * h + k_tail[:, :, :, n].transpose(-1, -2) @ v_new[:, :, :, n]
        if n in segments.ends:
            segments.final[:, :, :, segments.ends[n]] = h
    return states, v_new, h


def scan_fwd(
    prepared: Prepared, h: torch.Tensor, segments: BlockSegments
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o [B, Hk, G, N, C, V], entering states [B, Hk, G, N, K, V], the leaving state [B, Hk, G, K, V])."""
    p = prepared
    states, v_new, h = scan_states(k_tail=p.k_tail, w=p.w, u=p.u, decay=p.decay, h=h, segments=segments)
    return p.q_decayed @ states + p.attn @ v_new, states, h


def scan_bwd(
    prepared: Prepared,
    states: torch.Tensor,
    d_o: torch.Tensor,
    dh: torch.Tensor,
    segments: BlockSegments,
    v_new: torch.Tensor | None = None,
) -> tuple[Prepared, torch.Tensor]:
    """Gradients of the intermediates, and dL/d(the state entering the first chunk).

    dh: dL/d(the state leaving the last chunk) when it does not end a segment. Segments mirror the forward:
    a chunk that ends segment j leaves with segments.final's gradient (segments.final holds dL/dfinal here),
    and dL/d(segment j's initial state) is written to segments.initial[..., j].
    The reverse scan runs over chunks: dH_in = Qg^T dO - W^T (P^T dO) + e^gamma_C dH_out - W^T (Kt dH_out);
    everything else is batched over chunks afterwards. v_new: U - W H, when the caller has it.
    """
    q_decayed, k_tail, w, u, attn, decay = prepared
    d_v_local = attn.transpose(-1, -2) @ d_o  # the part of dv_new that does not go through later states
    wT = w.transpose(-1, -2)
    local = q_decayed.transpose(-1, -2) @ d_o - wT @ d_v_local  # [.., N, K, V]
    d_h_out = torch.empty_like(states)  # the gradient of the state leaving each chunk
    for n in range(w.shape[3] - 1, -1, -1):
        if n in segments.ends:
            dh = segments.final[:, :, :, segments.ends[n]]
        d_h_out[:, :, :, n] = dh
        dh = (
            local[:, :, :, n]
            + decay[:, :, :, n, None, None] * dh
            - wT[:, :, :, n] @ (k_tail[:, :, :, n] @ dh)
        )
        if n in segments.starts:
            segments.initial[:, :, :, segments.starts[n]] = dh
    if v_new is None:
        v_new = u - w @ states
    d_u = d_v_local + k_tail @ d_h_out
    grads = Prepared(
        q_decayed=d_o @ states.transpose(-1, -2),
        k_tail=v_new @ d_h_out.transpose(-1, -2),
        w=-(d_u @ states.transpose(-1, -2)),
        u=d_u,
        attn=d_o @ v_new.transpose(-1, -2),  # above the diagonal unused: P's consumers mask it by Gamma
        decay=(d_h_out * states).sum((-1, -2)),
    )
    return grads, dh


class ChunkScan(torch.autograd.Function):
    """scan_fwd / scan_bwd over every chunk as a Function (context parallelism's outputs once the entering
    states are known): saves the intermediates and the chunk states."""

    @staticmethod
    def forward(ctx, q_decayed, k_tail, w, u, attn, decay, h_start, grid):
        prepared = Prepared(q_decayed=q_decayed, k_tail=k_tail, w=w, u=u, attn=attn, decay=decay)
        final = h_start.clone()  # a segment without chunks (T = 0) leaves as it entered
        segments = block_segments(grid, 0, grid.num_chunks, h_start, final)
        o, states, _ = scan_fwd(prepared, h_start[:, :, :, 0], segments)
        ctx.save_for_backward(*prepared, states)
        ctx.grid = grid
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        *saved, states = ctx.saved_tensors
        prepared = Prepared(*saved)
        w, u = prepared.w, prepared.u
        d_o = torch.zeros_like(u) if d_o is None else d_o
        n = ctx.grid.num_segments
        if d_final is None:
            d_final = u.new_zeros(*u.shape[:3], n, w.shape[-1], u.shape[-1])
        d_start = d_final.clone()
        segments = block_segments(ctx.grid, 0, ctx.grid.num_chunks, d_start, d_final)
        grads, _ = scan_bwd(prepared, states, d_o, d_final[:, :, :, -1], segments)
        return (*grads, d_start, None)
