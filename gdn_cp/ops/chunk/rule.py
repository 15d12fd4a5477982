"""The fused chunked GDN (`chunk_gated_delta_rule`, FLA's signature): both stages in one autograd Function
that saves only its inputs, A and nothing of the intermediates. Forward and backward run block by block of
chunks, so that the intermediates of one block at a time are alive; the backward recomputes them (a few
batched products) and the chunk states (a forward scan from each block's saved entering state).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gdn_cp.ops.chunk.intermediates import ChunkInputs
from gdn_cp.ops.chunk.layout import (
    check_state_shape,
    chunked_inputs,
    outputs,
    segment_results,
    segment_states,
)
from gdn_cp.ops.chunk.prepare import check_chunk_size, chunk_decays, prepare_bwd, prepare_fwd
from gdn_cp.ops.chunk.scan import BlockSegments, block_segments, scan_bwd, scan_fwd, scan_states
from gdn_cp.ops.documents import ChunkGrid, check_packed_batch, document_bounds
from gdn_cp.ops.inputs import check_gdn_inputs

BACKWARD_BLOCK = 4
"""Chunks the fused backward recomputes and differentiates at a time: its working memory is that many
chunks' intermediates and their gradients, whatever T."""
FORWARD_BLOCK = 16
"""Chunks the fused forward prepares and scans at a time (a multiple of BACKWARD_BLOCK): larger, for fuller
batched products, since the forward keeps no gradients."""


def block_inputs(tensors: Sequence[torch.Tensor], span: slice) -> list[torch.Tensor]:
    """The chunks `span` of each [B, Hk, G, N, ...] tensor. Those with a trailing matrix (q, k, v, A, dO)
    are copied once into a block of their own: a slice along N cannot be flattened into one batch
    dimension with Hk and G, so every product reading the slice would copy it again (k feeds four). The
    per-token ones (gamma, beta) enter elementwise only and stay views."""
    return [t[:, :, :, span].contiguous() if t.dim() == 6 else t[:, :, :, span] for t in tensors]


def fused_fwd(
    inputs: ChunkInputs, h_start: torch.Tensor, grid: ChunkGrid, A: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused forward, block by block of chunks, so that the intermediates of one block at a time are
    alive: (o [B, Hk, G, N, C, V], final states [B, Hk, G, n, K, V], A [B, Hk, G, N, C, C], the state
    entering every backward block [B, Hk, G, ceil(N / BACKWARD_BLOCK), K, V]).

    inputs: chunked, contiguous q and k (`chunked_inputs`); h_start [B, Hk, G, n, K, V] each segment's
    entering state; A: the UT transforms when already computed (gdn_cp.ops.chunk.deferred), else computed.
    """
    v = inputs.v
    B, Hk, G, N, C, _ = v.shape
    o = torch.empty_like(v)
    if A is None:
        A, computed = v.new_empty(B, Hk, G, N, C, C), True
    else:
        computed = False
    final = h_start.clone()  # a segment without chunks (T = 0) leaves as it entered
    # The state entering every backward block, taken from the chunk states of each forward block.
    block_states = h_start.new_empty(B, Hk, G, -(-N // BACKWARD_BLOCK), *h_start.shape[-2:])
    h = h_start[:, :, :, 0]
    for lo in range(0, N, FORWARD_BLOCK):
        span = slice(lo, lo + FORWARD_BLOCK)
        segments = block_segments(grid, lo, lo + FORWARD_BLOCK, h_start, final)
        block = ChunkInputs(*block_inputs(inputs, span))
        block_decays = chunk_decays(block.gamma, None if grid.masks is None else grid.masks.block(span))
        if computed:
            prepared, A[:, :, :, span] = prepare_fwd(block, block_decays)
        else:
            prepared, _ = prepare_fwd(block, block_decays, A=A[:, :, :, span])
        o[:, :, :, span], states, h = scan_fwd(prepared, h, segments)
        first = lo // BACKWARD_BLOCK
        kept = states[:, :, :, ::BACKWARD_BLOCK]
        block_states[:, :, :, first : first + kept.shape[3]] = kept
    return o, final, A, block_states


def fused_bwd(
    inputs: ChunkInputs,
    A: torch.Tensor,
    block_states: torch.Tensor,
    h_start: torch.Tensor,
    grid: ChunkGrid,
    d_o: torch.Tensor | None,
    d_final: torch.Tensor | None,
) -> tuple[ChunkInputs, torch.Tensor]:
    """The fused backward: (the chunked inputs' gradients, dL/d(each segment's entering state)
    [B, Hk, G, n, K, V]), block by block from the last, recomputing each block's intermediates and chunk
    states from what `fused_fwd` kept; d_o and d_final (each segment's leaving state's gradient) None:
    zeros."""
    k, v = inputs.k, inputs.v
    d_o = torch.zeros_like(v) if d_o is None else d_o
    if d_final is None:
        d_final = v.new_zeros(*v.shape[:3], grid.num_segments, k.shape[-1], v.shape[-1])
    d_start = d_final.clone()
    dh = d_final[:, :, :, -1]  # the last chunk ends the last segment: replaced there
    # Each block's gradients are written once into their place (no autograd here, so in place is O(T)).
    out = [torch.empty_like(t) for t in inputs]
    for b in range(block_states.shape[3] - 1, -1, -1):
        lo = b * BACKWARD_BLOCK
        span = slice(lo, lo + BACKWARD_BLOCK)
        *block, A_block, d_o_block = block_inputs((*inputs, A, d_o), span)
        block_in = ChunkInputs(*block)
        block_decays = chunk_decays(block_in.gamma, None if grid.masks is None else grid.masks.block(span))
        p, _ = prepare_fwd(block_in, block_decays, A=A_block)
        # The recomputed forward needs the segments' initial states; its finals are not kept.
        replay = BlockSegments(grid.segment_starts(lo, lo + BACKWARD_BLOCK), {}, h_start, None)
        states, v_new, _ = scan_states(
            k_tail=p.k_tail, w=p.w, u=p.u, decay=p.decay, h=block_states[:, :, :, b], segments=replay
        )
        segments = block_segments(grid, lo, lo + BACKWARD_BLOCK, d_start, d_final)
        grads, dh = scan_bwd(p, states, d_o_block, dh, segments, v_new)
        d_inputs = prepare_bwd(block_in, A_block, grads, block_decays, attn=p.attn)
        for full, part in zip(out, d_inputs, strict=True):
            full[:, :, :, span] = part
    return ChunkInputs(*out), d_start


class ChunkGatedDeltaRule(torch.autograd.Function):
    """Both stages in one Function that saves only its inputs, A and the state entering every backward
    block; the backward recomputes the intermediates and the chunk states block by block."""

    @staticmethod
    def forward(ctx, q, k, v, gamma, beta, h_start, grid):
        # q and k arrive as strided views of [B, T, Hk, K] and feed every product: one copy each here (the
        # viewed tensors are then free); v, g, beta enter elementwise only and stay views.
        inputs = ChunkInputs(q.contiguous(), k.contiguous(), v, gamma, beta)
        o, final, A, block_states = fused_fwd(inputs, h_start, grid)
        ctx.save_for_backward(*inputs, A, block_states, h_start)
        ctx.grid = grid
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        *saved, A, block_states, h_start = ctx.saved_tensors
        grads, d_start = fused_bwd(ChunkInputs(*saved), A, block_states, h_start, ctx.grid, d_o, d_final)
        return (*grads, d_start, None)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The Gated DeltaNet over a whole sequence, chunk by chunk; same results as the recurrent reference.

    Arguments, shapes and results: gdn_cp.ops.backends.RuleOp (FLA's signature), chunk_size C (any T works).
    With cu_seqlens and without initial or final states the documents share chunks (no padding); with them
    every document gets chunks of its own (FLA's layout).
    """
    check_gdn_inputs(q, k, v, g, beta)
    check_chunk_size(chunk_size)
    B, T, _, K = k.shape
    Hv, V = v.shape[2], v.shape[3]
    bounds, resets = None, ()
    if cu_seqlens is not None:
        check_packed_batch(B)
        bounds = document_bounds(cu_seqlens, T)
        check_state_shape(initial_state, (len(bounds) - 1, Hv, K, V), "[n, Hv, K, V] (one per document)")
        if initial_state is not None:
            initial_state = initial_state.unsqueeze(0)
        elif not output_final_state:
            # No state in or out per document: documents share chunks (resets), with no padding.
            bounds, resets = None, bounds[1:-1]
    else:
        check_state_shape(initial_state, (B, Hv, K, V), "[B, Hv, K, V]")
    x = chunked_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, chunk_size, bounds, resets)
    h0 = segment_states(initial_state, x.v, x.grid.num_segments, K)
    o, final = ChunkGatedDeltaRule.apply(*x.inputs(), h0, x.grid)
    if output_final_state:
        final = segment_results(final, per_segment=bounds is not None)
        final = final[0] if bounds is not None else final
    else:
        final = None
    return outputs(o, x.seq_len, x.grid, q.dtype), final
