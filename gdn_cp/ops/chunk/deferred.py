"""Summaries without outputs, then the outputs with one backward at width V: FLA's KCP (fla.ops.cp) in the
chunk stages, what the sequence-shard CP modes run on backend gdn_cp.

A rank needs the packed map [S | M] of some of its segments before the exchange (the last segment of each
piece that feeds a later piece), and the outputs of every segment once the state entering it is known.

Forward:
- the summaries: per requested segment, the chunk chain of the state, no outputs and no graph,
      h <- e^{gamma_C} h + Kt^T ([U | 0] - W h)
  at width V + K from [0 | I] where its M is wanted (it continues a document and nothing resets it), at
  width V from its fresh state where M = 0;
- the outputs: the chunk scan at width V from each segment's entering state.

Backward: autograd runs the outputs' backward first (the summaries feed the exchange, which feeds the
outputs). Where a summary was taken, that backward is only KCP's pre-pass: the gradient of the states entering
the segments that read the exchanged state, the reverse chunk chain
    dH = Qg^T dO - W^T P^T dO + e^{gamma_C} dH' - W^T Kt dH'
from dO and the final states' gradients, which the exchange's backward folds with the later pieces' into
dS = dL/d(the state leaving each summarised segment). The summary's backward then runs the one backward of the
scan at width V, dS added to those segments' final-state gradients, and returns every input's gradient (and
the fresh states', which the outputs' backward leaves to it). dM is not read: the exchanges use (S, M) only as
H_out = M H_in + S, so dM = dS H_in^T, whose contribution is dS flowing through the scan from H_in, which that
backward applies.

What the backward needs is kept one of two ways (`recompute`): the prepared intermediates and the chunk
states (`PreparedSummary`, `PreparedOutputs`: nothing recomputed), or only the chunked inputs, the UT
transforms and the state entering every block of chunks, as the fused op keeps (`FusedSummary`,
`FusedOutputs`: one block's intermediates alive at a time, recomputed in backward, also by the pre-pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gdn_cp.ops.chunk.intermediates import ChunkInputs, Prepared
from gdn_cp.ops.chunk.prepare import chunk_decays, prepare_fwd, ut_transform
from gdn_cp.ops.chunk.rule import BACKWARD_BLOCK, FORWARD_BLOCK, block_inputs, fused_bwd, fused_fwd
from gdn_cp.ops.chunk.scan import block_segments, scan_bwd, scan_fwd
from gdn_cp.ops.documents import ChunkGrid

STATE_FIELDS = frozenset({"k_tail", "w", "u", "decay"})
"""The intermediates a summary's chain reads."""
ENTERING_FIELDS = frozenset({"q_decayed", "k_tail", "w", "attn", "decay"})
"""The intermediates the backward's pre-pass reads."""


@dataclass(eq=False)
class Link:
    """What a summary's Function and the outputs' Function share: the requests, and what the outputs'
    backward hands the summary's (where the one backward runs, once dS has arrived)."""

    grid: ChunkGrid
    carried: tuple[bool, ...]
    """[n] which segments enter with the exchanged state (the others with their fresh state)."""
    summarised: tuple[int, ...]
    """The segments whose [S | M] is taken, in the order of the summaries."""
    maps: tuple[bool, ...]
    """Per summarised segment: M wanted (its chain at V + K from [0 | I]); else M = 0 (at V)."""
    A: torch.Tensor | None = field(default=None, repr=False)
    """Fused: the UT transforms, computed by the summary's forward for the outputs' forward."""
    pending: tuple | None = field(default=None, repr=False)
    """Set by the outputs' backward: (d_o, d_final, what the one backward reads)."""

    @property
    def deferred(self) -> bool:
        """Whether the outputs' backward leaves the inputs' gradients to the summary's."""
        return bool(self.summarised)

    def chunks(self, segment: int) -> tuple[int, int]:
        """The chunks [lo, hi) of `segment`."""
        return self.grid.chunk_offsets[segment], self.grid.chunk_offsets[segment + 1]

    def take_pending(self) -> tuple:
        if self.pending is None:
            raise RuntimeError(
                "the summary's backward ran before the outputs' backward: gdn_cp.ops.chunk.deferred needs "
                "the outputs of SummarisedChunks.with_entering_states in the graph that reaches the summaries"
            )
        pending, self.pending = self.pending, None
        return pending

    def final_grads(
        self, d_final: torch.Tensor | None, d_packed: torch.Tensor | None, like: torch.Tensor, k_dim: int
    ) -> torch.Tensor:
        """The final states' gradients [B, Hk, G, n, K, V], with dS (the first V columns of d_packed
        [B, Hk, G, m, K, V + K]) added at the summarised segments; like: U or v (sizes, dtype)."""
        B, Hk, G, V = *like.shape[:3], like.shape[-1]
        if d_final is None:
            d_final = like.new_zeros(B, Hk, G, self.grid.num_segments, k_dim, V)
        else:
            d_final = d_final.clone()
        if d_packed is not None:
            index = torch.tensor(self.summarised, device=d_final.device)
            d_final.index_add_(3, index, d_packed[..., :V].to(d_final.dtype))
        return d_final

    def carried_mask(self, device: torch.device) -> torch.Tensor:
        """[1, 1, 1, n, 1, 1] bool, against [B, Hk, G, n, K, V] states."""
        return torch.tensor(self.carried, device=device).view(1, 1, 1, -1, 1, 1)


def chain(
    h: torch.Tensor,
    k_tail: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    decay: torch.Tensor,
    from_identity: bool = False,
) -> torch.Tensor:
    """The state after the chunks of k_tail, w [..., n, C, K], u [..., n, C, V], decay [..., n], from
    h [..., K, V] or [..., K, V + K] (U then counting as [U | 0]); from_identity: h is [0 | I], so that the
    first chunk's W h is [0 | W] without the product."""
    V = u.shape[-1]
    for c in range(u.shape[3]):
        w_c = w[:, :, :, c]
        if from_identity and c == 0:
            v_new = torch.cat([u[:, :, :, c], -w_c], dim=-1)
        else:
            v_new = -(w_c @ h)
            v_new[..., :V] += u[:, :, :, c]
        h = decay[:, :, :, c, None, None] * h + k_tail[:, :, :, c].transpose(-1, -2) @ v_new
    return h


def entering_grad(prepared: Prepared, d_o: torch.Tensor | None, dh: torch.Tensor) -> torch.Tensor:
    """dL/d(the state entering the first of `prepared`'s n chunks) from d_o [..., n, C, V] (None: zeros) and
    dh, dL/d(the state leaving the last): the reverse chunk chain of the scan's backward, nothing else."""
    p = prepared
    wT = p.w.transpose(-1, -2)
    local = None
    if d_o is not None:
        local = p.q_decayed.transpose(-1, -2) @ d_o - wT @ (p.attn.transpose(-1, -2) @ d_o)
    for c in range(p.w.shape[3] - 1, -1, -1):
        dh = p.decay[:, :, :, c, None, None] * dh - wT[:, :, :, c] @ (p.k_tail[:, :, :, c] @ dh)
        if local is not None:
            dh = dh + local[:, :, :, c]
    return dh


def chain_starts(
    link: Link, fresh: torch.Tensor | None, like: torch.Tensor, k_dim: int
) -> list[torch.Tensor]:
    """The state each summarised segment's chain starts from: [0 | I] where its M is wanted, else its fresh
    state (fresh [B, Hk, G, n, K, V] or None: zeros); like: U or v [B, Hk, G, ..., V] (sizes, dtype)."""
    B, Hk, G, V = *like.shape[:3], like.shape[-1]
    starts = []
    for j, wanted in zip(link.summarised, link.maps, strict=True):
        if wanted:
            h = like.new_zeros(B, Hk, G, k_dim, V + k_dim)
            h[..., V:] = torch.eye(k_dim, dtype=like.dtype, device=like.device)
        else:
            h = like.new_zeros(B, Hk, G, k_dim, V) if fresh is None else fresh[:, :, :, j].to(like.dtype)
        starts.append(h)
    return starts


def pack(states: list[torch.Tensor], V: int, k_dim: int) -> torch.Tensor:
    """[B, Hk, G, m, K, V + K]: the chains' last states, M = 0 where a chain ran at width V."""
    B, Hk, G = states[0].shape[:3]
    out = states[0].new_zeros(B, Hk, G, len(states), k_dim, V + k_dim)
    for i, h in enumerate(states):
        out[:, :, :, i, :, : h.shape[-1]] = h
    return out


def prepared_summaries(prepared: Prepared, link: Link, fresh: torch.Tensor | None) -> torch.Tensor:
    """[B, Hk, G, m, K, V + K] the summarised segments' [S | M], from kept intermediates."""
    p = prepared
    K, V = p.w.shape[-1], p.u.shape[-1]
    states = []
    for h, j, wanted in zip(chain_starts(link, fresh, p.u, K), link.summarised, link.maps, strict=True):
        span = slice(*link.chunks(j))
        part = (p.k_tail[:, :, :, span], p.w[:, :, :, span], p.u[:, :, :, span], p.decay[:, :, :, span])
        states.append(chain(h, *part, from_identity=wanted))
    return pack(states, V, K)


def fused_summaries(
    inputs: ChunkInputs, link: Link, fresh: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, Hk, G, m, K, V + K] the summarised segments' [S | M], A [B, Hk, G, N, C, C] the UT transform of
    every chunk), block by block of chunks as the fused forward: one block's intermediates alive at a time."""
    grid = link.grid
    B, Hk, G, N, C, V = inputs.v.shape
    K = inputs.k.shape[-1]
    A = inputs.v.new_empty(B, Hk, G, N, C, C)
    states = chain_starts(link, fresh, inputs.v, K)
    started = [False] * len(states)
    ranges = [link.chunks(j) for j in link.summarised]
    for lo in range(0, N, FORWARD_BLOCK):
        hi = min(lo + FORWARD_BLOCK, N)
        span = slice(lo, hi)
        block = ChunkInputs(*block_inputs(inputs, span))
        decays = chunk_decays(block.gamma, None if grid.masks is None else grid.masks.block(span))
        inside = [i for i, (a, b) in enumerate(ranges) if a < hi and b > lo]
        if not inside:
            A[:, :, :, span] = ut_transform(block, decays)
            continue
        p, A[:, :, :, span] = prepare_fwd(block, decays, fields=STATE_FIELDS)
        for i in inside:
            part = slice(max(ranges[i][0], lo) - lo, min(ranges[i][1], hi) - lo)
            sub = (p.k_tail[:, :, :, part], p.w[:, :, :, part], p.u[:, :, :, part], p.decay[:, :, :, part])
            states[i] = chain(states[i], *sub, from_identity=link.maps[i] and not started[i])
            started[i] = True
    return pack(states, V, K), A


# -- kept intermediates --------------------------------------------------------------------------------------


class PreparedSummary(torch.autograd.Function):
    """The summaries from kept intermediates; its backward is the one backward of the scan (module
    docstring). Takes all six intermediates, so that it can return their gradients."""

    @staticmethod
    def forward(ctx, q_decayed, k_tail, w, u, attn, decay, fresh, link):
        prepared = Prepared(q_decayed, k_tail, w, u, attn, decay)
        ctx.link = link
        ctx.has_fresh = fresh is not None
        ctx.set_materialize_grads(False)
        return prepared_summaries(prepared, link, fresh)

    @staticmethod
    def backward(ctx, d_packed):
        link = ctx.link
        d_o, d_final, (prepared, states) = link.take_pending()
        u, w = prepared.u, prepared.w
        d_final = link.final_grads(d_final, d_packed, u, w.shape[-1])
        d_o = torch.zeros_like(u) if d_o is None else d_o
        d_start = d_final.clone()
        segments = block_segments(link.grid, 0, link.grid.num_chunks, d_start, d_final)
        grads, _ = scan_bwd(prepared, states, d_o, d_final[:, :, :, -1], segments)
        d_fresh = torch.where(link.carried_mask(u.device), 0.0, d_start) if ctx.has_fresh else None
        return (*grads, d_fresh, None)


class PreparedOutputs(torch.autograd.Function):
    """The chunk scan at width V from each segment's entering state, over kept intermediates (as
    gdn_cp.ops.chunk.scan.ChunkScan); deferred (a summary was taken): its backward is the pre-pass."""

    @staticmethod
    def forward(ctx, q_decayed, k_tail, w, u, attn, decay, h_start, link):
        prepared = Prepared(q_decayed, k_tail, w, u, attn, decay)
        final = h_start.clone()  # a segment without chunks (T = 0) leaves as it entered
        segments = block_segments(link.grid, 0, link.grid.num_chunks, h_start, final)
        o, states, _ = scan_fwd(prepared, h_start[:, :, :, 0], segments)
        ctx.save_for_backward(*prepared, states)
        ctx.link = link
        ctx.set_materialize_grads(False)
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        *saved, states = ctx.saved_tensors
        prepared, link = Prepared(*saved), ctx.link
        u, K = prepared.u, prepared.w.shape[-1]
        if link.deferred:
            link.pending = (d_o, d_final, (prepared, states))
            d_start = u.new_zeros(*u.shape[:3], link.grid.num_segments, K, u.shape[-1])
            for j, carried in enumerate(link.carried):
                if carried:
                    span = slice(*link.chunks(j))
                    part = Prepared(*(None if t is None else t[:, :, :, span] for t in prepared))
                    dh = d_start[:, :, :, j] if d_final is None else d_final[:, :, :, j]
                    d_start[:, :, :, j] = entering_grad(part, None if d_o is None else d_o[:, :, :, span], dh)
            return (None,) * 6 + (d_start, None)
        d_final = link.final_grads(d_final, None, u, K)
        d_o = torch.zeros_like(u) if d_o is None else d_o
        d_start = d_final.clone()
        segments = block_segments(link.grid, 0, link.grid.num_chunks, d_start, d_final)
        grads, _ = scan_bwd(prepared, states, d_o, d_final[:, :, :, -1], segments)
        return (*grads, d_start, None)


# -- recomputed intermediates --------------------------------------------------------------------------------


class FusedSummary(torch.autograd.Function):
    """The summaries from the chunked inputs, block by block; also computes every chunk's UT transform for
    the outputs' forward (`Link.A`). Its backward is the fused backward (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, gamma, beta, fresh, link):
        packed, link.A = fused_summaries(ChunkInputs(q, k, v, gamma, beta), link, fresh)
        ctx.link = link
        ctx.has_fresh = fresh is not None
        ctx.set_materialize_grads(False)
        return packed

    @staticmethod
    def backward(ctx, d_packed):
        link = ctx.link
        d_o, d_final, (inputs, A, block_states, h_start) = link.take_pending()
        d_final = link.final_grads(d_final, d_packed, inputs.v, inputs.k.shape[-1])
        grads, d_start = fused_bwd(inputs, A, block_states, h_start, link.grid, d_o, d_final)
        d_fresh = torch.where(link.carried_mask(d_start.device), 0.0, d_start) if ctx.has_fresh else None
        return (*grads, d_fresh, None)


class FusedOutputs(torch.autograd.Function):
    """The fused op (gdn_cp.ops.chunk.rule) at width V from each segment's entering state, with the summary's
    UT transforms where one was taken; deferred: its backward is the pre-pass, block by block."""

    @staticmethod
    def forward(ctx, q, k, v, gamma, beta, h_start, link):
        inputs = ChunkInputs(q, k, v, gamma, beta)
        o, final, A, block_states = fused_fwd(inputs, h_start, link.grid, A=link.A)
        link.A = None  # kept by this Function from here
        ctx.save_for_backward(*inputs, A, block_states, h_start)
        ctx.link = link
        ctx.set_materialize_grads(False)
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        *saved, A, block_states, h_start = ctx.saved_tensors
        inputs, link = ChunkInputs(*saved), ctx.link
        if not link.deferred:
            grads, d_start = fused_bwd(inputs, A, block_states, h_start, link.grid, d_o, d_final)
            return (*grads, d_start, None)
        link.pending = (d_o, d_final, (inputs, A, block_states, h_start))
        d_start = torch.zeros_like(h_start)
        masks = link.grid.masks
        for j, carried in enumerate(link.carried):
            if not carried:
                continue
            lo, hi = link.chunks(j)
            dh = d_start[:, :, :, j] if d_final is None else d_final[:, :, :, j]
            for end in range(hi, lo, -BACKWARD_BLOCK):  # block by block from the segment's end
                span = slice(max(lo, end - BACKWARD_BLOCK), end)
                *block, A_block = block_inputs((*inputs, A), span)
                block = ChunkInputs(*block)
                decays = chunk_decays(block.gamma, None if masks is None else masks.block(span))
                p, _ = prepare_fwd(block, decays, A=A_block, fields=ENTERING_FIELDS)
                dh = entering_grad(p, None if d_o is None else d_o[:, :, :, span], dh)
            d_start[:, :, :, j] = dh
        return (None,) * 5 + (d_start, None)
