"""Chunked (WY / UT-transform) Gated DeltaNet: the fast path, with a hand-written backward.

Math (design.md section 2), per chunk of C tokens with in-chunk cumulative log-decay gamma:
    Gamma_ij = exp(gamma_i - gamma_j) for i >= j, else 0
    L = strict_lower(diag(beta) K K^T * Gamma),  A = (I + L)^-1          (the UT transform, explicit)
    W = A (beta e^gamma K),  U = A (beta V),  Kt = e^(gamma_C - gamma) K,  Qg = e^gamma Q,  P = Q K^T * Gamma
    v_new = U - W H,  o = Qg H + P v_new,  H' = e^gamma_C H + Kt^T v_new

Layout: the plain functions below work on [B, Hk, G, N, C, ...] tensors, value heads grouped under their key
head (G = Hv / Hk), so that q and k ([B, Hk, 1, ...]) broadcast over the group instead of being repeated,
and K K^T, Q K^T are computed once per key head.

Three pieces, each a plain forward and backward function with an autograd.Function over them (FLA's
structure):
- prepare (`_prepare_fwd` / `_prepare_bwd`): inputs -> the state-independent intermediates (Qg, Kt, W, U, P,
  decay) and A. The inverse is matmul-only (gdn_cp.ops.triangular), so no triangular solve runs forward or
  backward.
- scan (`_scan_fwd` / `_scan_bwd`): intermediates and an entering state -> outputs and the leaving state;
  the backward is the reverse chunk scan for dH (dH = Qg^T dO + e^gamma_C dH' - W^T dv_new) and batched
  formulas for everything else.
- the fused op (`chunk_gated_delta_rule`): both in one Function that saves only its inputs, A and nothing of
  the intermediates; the backward recomputes them (a few batched products) and the chunk states (a
  forward scan), block by block of chunks so that its memory stays a small multiple of one block.
Context parallelism uses the first two separately (`prepare_chunks`, `chunk_outputs`): a rank prepares once,
summarises (gdn_cp.ops.summary), and computes its outputs when the entering state arrives.

Segments (packed documents, cu_seqlens; gdn_cp.ops.documents): every segment is cut into chunks of its own,
so the chunk math above is unchanged; the scan enters a segment's first chunk with that segment's initial
state and writes the state leaving its last chunk as the segment's final state (the backward mirrors both).
Without cu_seqlens the whole sequence is one segment.

Every Python loop is over chunks with constant work per step, and the backward writes each gradient once:
O(T) in forward and backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gdn_cp.ops.documents import ChunkGrid, ResetMasks, check_packed_batch, chunk_grid, document_bounds
from gdn_cp.ops.inputs import check_gdn_inputs, head_major_inputs
from gdn_cp.ops.triangular import unit_lower_inverse

BACKWARD_BLOCK = 4
"""Chunks the fused backward recomputes and differentiates at a time: its working memory is that many
chunks' intermediates and their gradients, whatever T."""
FORWARD_BLOCK = 16
"""Chunks the fused forward prepares and scans at a time (a multiple of BACKWARD_BLOCK): larger, for fuller
batched products, since the forward keeps no gradients."""


@dataclass(frozen=True, slots=True)
class ChunkIntermediates:
    """The state-independent part of every chunk, in the accumulation dtype (see the module docstring).

    Tensors are [B, Hk, G, N, C, ...] (value heads grouped under their key head); the properties give the
    [B, Hv, N, C, ...] views.
    """

    q_decayed: torch.Tensor
    """[B, Hk, G, N, C, K] Qg = e^gamma Q (scaled q): reads the entering state."""
    k_tail_grouped: torch.Tensor
    """[B, Hk, G, N, C, K] Kt = e^(gamma_C - gamma) K: writes into the leaving state."""
    w_grouped: torch.Tensor
    """[B, Hk, G, N, C, K] W = A (beta e^gamma K): what the entering state predicts of each value."""
    u_grouped: torch.Tensor
    """[B, Hk, G, N, C, V] U = A (beta V): the values as written from a zero state."""
    attn_grouped: torch.Tensor
    """[B, Hk, G, N, C, C] P = Q K^T * Gamma, lower triangle including the diagonal."""
    decay_grouped: torch.Tensor
    """[B, Hk, G, N] e^gamma_C: decay of the whole chunk."""
    seq_len: int
    """T before padding to a multiple of C."""
    dtype: torch.dtype
    """The caller's dtype: outputs come back in it."""
    grid: ChunkGrid
    """Which chunks hold which tokens, and which chunks each segment (document) owns."""
    per_segment: bool = False
    """Prepared with cu_seqlens: states are given and returned per segment ([B, n, Hv, K, V])."""

    @property
    def num_chunks(self) -> int:
        return self.w_grouped.shape[3]

    @property
    def q(self) -> torch.Tensor:
        """[B, Hv, N, C, K]"""
        return self.q_decayed.flatten(1, 2)

    @property
    def k_tail(self) -> torch.Tensor:
        """[B, Hv, N, C, K]"""
        return self.k_tail_grouped.flatten(1, 2)

    @property
    def w(self) -> torch.Tensor:
        """[B, Hv, N, C, K]"""
        return self.w_grouped.flatten(1, 2)

    @property
    def u(self) -> torch.Tensor:
        """[B, Hv, N, C, V]"""
        return self.u_grouped.flatten(1, 2)

    @property
    def attn(self) -> torch.Tensor:
        """[B, Hv, N, C, C]"""
        return self.attn_grouped.flatten(1, 2)

    @property
    def decay(self) -> torch.Tensor:
        """[B, Hv, N]"""
        return self.decay_grouped.flatten(1, 2)


def _check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")


# ---------------------------------------------------------------------------------------------------------
# prepare: inputs -> intermediates


def _decays(
    gamma: torch.Tensor, masks: ResetMasks | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Gamma [..., C, C], e^gamma, e^(gamma_C - gamma), e^gamma_C [...]) of cumulative log-decays
    [..., N, C]; with `masks` (documents sharing chunks), each masked to what stays inside a document.

    The masks are constants multiplying exponentials, so every gradient formula of `_prepare_bwd`, written
    with these values, stays exact."""
    C = gamma.shape[-1]
    drop = torch.ones(C, C, dtype=torch.bool, device=gamma.device).triu(1)
    if masks is not None:
        drop = drop | ~masks.same
    # Mask before exp: above the diagonal gamma_i - gamma_j > 0 and could overflow.
    Gamma = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(drop, float("-inf")).exp()
    last = gamma[..., -1:]
    e_gamma, e_tail, decay = gamma.exp(), (last - gamma).exp(), last.squeeze(-1).exp()
    if masks is not None:
        e_gamma, e_tail, decay = e_gamma * masks.reads, e_tail * masks.writes, decay * masks.keeps
    return Gamma, e_gamma, e_tail, decay


def _prepare_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    decays: tuple[torch.Tensor, ...],
    A: torch.Tensor | None = None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Intermediates (Qg, Kt, W, U, P, decay) and A of chunked inputs (A computed unless given).

    Args:
        q, k: [B, Hk, 1, N, C, K];  v: [B, Hk, G, N, C, V];  gamma (cumulative in each chunk), beta:
        [B, Hk, G, N, C];  decays: `_decays(gamma, masks)`;  A: [B, Hk, G, N, C, C]
    """
    Gamma, e_gamma, e_tail, decay = decays
    if A is None:
        A = unit_lower_inverse((k @ k.transpose(-1, -2)) * Gamma * beta[..., None])
    w = A @ (k * (beta * e_gamma)[..., None])
    u = A @ (v * beta[..., None])
    attn = (q @ k.transpose(-1, -2)) * Gamma
    q_decayed = q * e_gamma[..., None]
    k_tail = k * e_tail[..., None]
    return (q_decayed, k_tail, w, u, attn, decay), A


def _prepare_bwd(
    saved: tuple[torch.Tensor, ...],
    A: torch.Tensor,
    grads: tuple[torch.Tensor | None, ...],
    decays: tuple[torch.Tensor, ...],
    attn: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """Gradients of (q, k, v, gamma, beta) from those of (Qg, Kt, W, U, P, decay); any of them may be None.

    Shapes as `_prepare_fwd`; dq and dk come back summed over the group ([B, Hk, 1, ...]). An input that
    none of the given gradients reads gets None (a state summary reads neither q nor, through P, Qg).
    Products with q or k, which the group shares, are taken once per key head on the group's summed
    gradient. decays: `_decays(gamma, masks)`; attn (P): when the caller has it (else recomputed).
    """
    q, k, v, gamma, beta = saved
    d_qd, d_kt, d_w, d_u, d_attn, d_decay = grads
    Gamma, e_gamma, e_tail, decay = decays
    kT = k.transpose(-1, -2)
    per_head = torch.broadcast_shapes(q.shape[:-1], gamma.shape)
    dk = q.new_zeros(*per_head, q.shape[-1])  # elementwise parts, per value head
    dq = dq_shared = dk_shared = None  # parts already summed over the group, [B, Hk, 1, N, C, K]
    d_gamma = torch.zeros_like(gamma)
    d_last = torch.zeros_like(gamma[..., 0])
    dv = d_beta = None

    if d_qd is not None:  # Qg = e^gamma q
        dq = (d_qd * e_gamma[..., None]).sum(2, keepdim=True)
        d_gamma += (d_qd * q).sum(-1) * e_gamma
    if d_kt is not None:  # Kt = e^(gamma_C - gamma) k
        contrib = (d_kt * k).sum(-1) * e_tail
        dk += d_kt * e_tail[..., None]
        d_gamma -= contrib
        d_last += contrib.sum(-1)
    if d_decay is not None:  # decay = e^gamma_C
        d_last += d_decay * decay
    if d_attn is not None:  # P = q k^T * Gamma
        d_qk = d_attn * Gamma
        E = d_attn * ((q @ kT) * Gamma if attn is None else attn)
        d_gamma += E.sum(-1) - E.sum(-2)
        d_qk = d_qk.sum(2, keepdim=True)
        dq_shared = d_qk @ k
        dk_shared = d_qk.transpose(-1, -2) @ q
    if d_w is not None or d_u is not None:  # W = A (beta e^gamma k), U = A (beta v)
        be = beta * e_gamma
        rhs, d_rhs = [], []  # W and U share A: one product for both
        if d_w is not None:
            rhs.append(k * be[..., None])
            d_rhs.append(d_w)
        if d_u is not None:
            rhs.append(v * beta[..., None])
            d_rhs.append(d_u)
        d_out = torch.cat(d_rhs, -1) if len(d_rhs) > 1 else d_rhs[0]
        AT = A.transpose(-1, -2)
        d_A = d_out @ (torch.cat(rhs, -1) if len(rhs) > 1 else rhs[0]).transpose(-1, -2)
        d_in = AT @ d_out
        d_beta = torch.zeros_like(beta)
        if d_w is not None:
            d_kb = d_in[..., : k.shape[-1]]
            dk += d_kb * be[..., None]
            kb_dot = (d_kb * k).sum(-1) * e_gamma
            d_beta += kb_dot
            d_gamma += kb_dot * beta
        if d_u is not None:
            d_vb = d_in[..., -v.shape[-1] :]
            dv = d_vb * beta[..., None]
            d_beta += (d_vb * v).sum(-1)
        # A = (I + L)^-1  =>  dL = -A^T dA A^T on the strict lower triangle where L lives; minus_dL holds
        # -dL, the sign folded into its uses.
        minus_dL = (AT @ d_A @ AT).tril(-1)
        kk_gamma = (k @ kT) * Gamma
        d_beta -= (minus_dL * kk_gamma).sum(-1)
        E = minus_dL * kk_gamma * beta[..., None]
        d_gamma -= E.sum(-1) - E.sum(-2)
        d_kk = (minus_dL * Gamma * beta[..., None]).sum(2, keepdim=True)
        d_kk = (d_kk + d_kk.transpose(-1, -2)) @ k
        dk_shared = -d_kk if dk_shared is None else dk_shared - d_kk

    d_gamma[..., -1] += d_last  # gamma_C is the last position's gamma
    dk = dk.sum(2, keepdim=True)
    if dq_shared is not None:
        dq = dq_shared if dq is None else dq + dq_shared
    if dk_shared is not None:
        dk += dk_shared
    return dq, dk, dv, d_gamma, d_beta


class _PrepareChunks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gamma, beta, masks):
        out, A = _prepare_fwd(q, k, v, gamma, beta, _decays(gamma, masks))
        ctx.save_for_backward(q, k, v, gamma, beta, A)
        ctx.masks = masks
        ctx.set_materialize_grads(False)  # unused intermediates (a summary reads four) stay None
        return out

    @staticmethod
    def backward(ctx, *grads):
        *saved, A = ctx.saved_tensors
        return (*_prepare_bwd(tuple(saved), A, grads, _decays(saved[3], ctx.masks)), None)


# ---------------------------------------------------------------------------------------------------------
# scan: intermediates and an entering state -> outputs and the leaving state


@dataclass(frozen=True, slots=True)
class _BlockSegments:
    """The segments (documents) seen by one scan over a block of chunks: `starts` / `ends` map a chunk of the
    block to the segment it starts / ends; `initial` and `final` are [B, Hk, G, n, K, V], the segments'
    entering and leaving states (their gradients in a backward scan)."""

    starts: dict[int, int]
    ends: dict[int, int]
    initial: torch.Tensor
    final: torch.Tensor | None


def _block_segments(
    grid: ChunkGrid, lo: int, hi: int, initial: torch.Tensor, final: torch.Tensor
) -> _BlockSegments:
    return _BlockSegments(grid.segment_starts(lo, hi), grid.segment_ends(lo, hi), initial, final)


def _scan_states(
    k_tail: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    decay: torch.Tensor,
    h: torch.Tensor,
    segments: _BlockSegments,
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


def _scan_fwd(
    inter: tuple[torch.Tensor, ...], h: torch.Tensor, segments: _BlockSegments
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o [B, Hk, G, N, C, V], entering states [B, Hk, G, N, K, V], the leaving state [B, Hk, G, K, V])."""
    q_decayed, k_tail, w, u, attn, decay = inter
    states, v_new, h = _scan_states(k_tail, w, u, decay, h, segments)
    return q_decayed @ states + attn @ v_new, states, h


def _scan_bwd(
    inter: tuple[torch.Tensor, ...],
    states: torch.Tensor,
    d_o: torch.Tensor,
    dh: torch.Tensor,
    segments: _BlockSegments,
    v_new: torch.Tensor | None = None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Gradients of the intermediates (Qg, Kt, W, U, P, decay), and dL/d(the state entering the first chunk).

    dh: dL/d(the state leaving the last chunk) when it does not end a segment. Segments mirror the forward:
    a chunk that ends segment j leaves with segments.final's gradient (segments.final holds dL/dfinal here),
    and dL/d(segment j's initial state) is written to segments.initial[..., j].
    The reverse scan runs over chunks: dH_in = Qg^T dO - W^T (P^T dO) + e^gamma_C dH_out - W^T (Kt dH_out);
    everything else is batched over chunks afterwards. v_new: U - W H, when the caller has it.
    """
    q_decayed, k_tail, w, u, attn, decay = inter
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
    grads = (
        d_o @ states.transpose(-1, -2),  # Qg
        v_new @ d_h_out.transpose(-1, -2),  # Kt
        -(d_u @ states.transpose(-1, -2)),  # W
        d_u,  # U
        d_o @ v_new.transpose(-1, -2),  # P (above the diagonal unused: P's consumers mask it by Gamma)
        (d_h_out * states).sum((-1, -2)),  # decay
    )
    return grads, dh


class _ChunkScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_decayed, k_tail, w, u, attn, decay, h_start, grid):
        inter = (q_decayed, k_tail, w, u, attn, decay)
        final = h_start.clone()  # a segment without chunks (T = 0) leaves as it entered
        segments = _block_segments(grid, 0, grid.num_chunks, h_start, final)
        o, states, _ = _scan_fwd(inter, h_start[:, :, :, 0], segments)
        ctx.save_for_backward(*inter, states)
        ctx.grid = grid
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        *inter, states = ctx.saved_tensors
        w, u = inter[2], inter[3]
        d_o = torch.zeros_like(u) if d_o is None else d_o
        n = ctx.grid.num_segments
        if d_final is None:
            d_final = u.new_zeros(*u.shape[:3], n, w.shape[-1], u.shape[-1])
        d_start = d_final.clone()
        segments = _block_segments(ctx.grid, 0, ctx.grid.num_chunks, d_start, d_final)
        grads, _ = _scan_bwd(tuple(inter), states, d_o, d_final[:, :, :, -1], segments)
        return (*grads, d_start, None)


# ---------------------------------------------------------------------------------------------------------
# the fused op: prepare + scan, saving inputs and A only


def _block_inputs(tensors: Sequence[torch.Tensor], span: slice) -> list[torch.Tensor]:
    """The chunks `span` of each [B, Hk, G, N, ...] tensor. Those with a trailing matrix (q, k, v, A, dO)
    are copied once into a block of their own: a slice along N cannot be flattened into one batch
    dimension with Hk and G, so every product reading the slice would copy it again (k feeds four). The
    per-token ones (gamma, beta) enter elementwise only and stay views."""
    return [t[:, :, :, span].contiguous() if t.dim() == 6 else t[:, :, :, span] for t in tensors]


class _ChunkGatedDeltaRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gamma, beta, h_start, grid):
        # Block by block of chunks, so that the intermediates of one block at a time are alive; kept: the
        # outputs, A, and the state entering every block.
        # q and k arrive as strided views of [B, T, Hk, K] and feed every product: one copy each here (the
        # viewed tensors are then free); v, g, beta enter elementwise only and stay views.
        q, k = q.contiguous(), k.contiguous()
        B, Hk, G, N, C, _ = v.shape
        o = torch.empty_like(v)
        A = v.new_empty(B, Hk, G, N, C, C)
        final = h_start.clone()  # a segment without chunks (T = 0) leaves as it entered
        # The state entering every backward block, taken from the chunk states of each forward block.
        block_states = h_start.new_empty(B, Hk, G, -(-N // BACKWARD_BLOCK), *h_start.shape[-2:])
        h = h_start[:, :, :, 0]
        for lo in range(0, N, FORWARD_BLOCK):
            span = slice(lo, lo + FORWARD_BLOCK)
            segments = _block_segments(grid, lo, lo + FORWARD_BLOCK, h_start, final)
            block = _block_inputs((q, k, v, gamma, beta), span)
            decays = _decays(block[3], None if grid.masks is None else grid.masks.block(span))
            inter, A[:, :, :, span] = _prepare_fwd(*block, decays)
            o[:, :, :, span], states, h = _scan_fwd(inter, h, segments)
            first = lo // BACKWARD_BLOCK
            kept = states[:, :, :, ::BACKWARD_BLOCK]
            block_states[:, :, :, first : first + kept.shape[3]] = kept
        ctx.save_for_backward(q, k, v, gamma, beta, A, block_states, h_start)
        ctx.grid = grid
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        q, k, v, gamma, beta, A, block_states, h_start = ctx.saved_tensors
        grid = ctx.grid
        d_o = torch.zeros_like(v) if d_o is None else d_o
        if d_final is None:
            d_final = v.new_zeros(*v.shape[:3], grid.num_segments, k.shape[-1], v.shape[-1])
        d_start = d_final.clone()
        dh = d_final[:, :, :, -1]  # the last chunk ends the last segment: replaced there
        # Each block's gradients are written once into their place (no autograd here, so in place is O(T)).
        out = [torch.empty_like(t) for t in (q, k, v, gamma, beta)]
        for b in range(block_states.shape[3] - 1, -1, -1):
            lo = b * BACKWARD_BLOCK
            span = slice(lo, lo + BACKWARD_BLOCK)
            *inputs, A_block, d_o_block = _block_inputs((q, k, v, gamma, beta, A, d_o), span)
            decays = _decays(inputs[3], None if grid.masks is None else grid.masks.block(span))
            inter, _ = _prepare_fwd(*inputs, decays, A=A_block)
            # The recomputed forward needs the segments' initial states; its finals are not kept.
            replay = _BlockSegments(grid.segment_starts(lo, lo + BACKWARD_BLOCK), {}, h_start, None)
            states, v_new, _ = _scan_states(*inter[1:4], inter[5], block_states[:, :, :, b], replay)
            segments = _block_segments(grid, lo, lo + BACKWARD_BLOCK, d_start, d_final)
            grads, dh = _scan_bwd(inter, states, d_o_block, dh, segments, v_new)
            for full, part in zip(
                out, _prepare_bwd(tuple(inputs), A_block, grads, decays, attn=inter[4]), strict=True
            ):
                full[:, :, :, span] = part
        return (*out, d_start, None)


# ---------------------------------------------------------------------------------------------------------
# public API


@dataclass(frozen=True, slots=True)
class _Chunked:
    """Inputs of the pieces: head-major, in chunks (`grid`), grouped, in the accumulation dtype."""

    q: torch.Tensor  # [B, Hk, 1, N, C, K]
    k: torch.Tensor  # [B, Hk, 1, N, C, K]
    v: torch.Tensor  # [B, Hk, G, N, C, V]
    g: torch.Tensor  # [B, Hk, G, N, C]  (per token; cumulated inside each chunk by the caller)
    beta: torch.Tensor  # [B, Hk, G, N, C]
    seq_len: int
    grid: ChunkGrid


def _chunked_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    use_qk_l2norm_in_kernel: bool,
    chunk_size: int,
    bounds: list[int] | None,
    resets: Sequence[int] = (),
) -> _Chunked:
    """Normalise, cast and lay out the inputs in chunks (segments `bounds`, `resets` masked; see
    gdn_cp.ops.documents); padding (the tail of every segment) has g = 0 and beta = 0, which leaves the
    state untouched."""
    x = head_major_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel)
    B, Hk, T, _ = x.k.shape
    G = x.v.shape[1] // Hk
    C = chunk_size
    grid = chunk_grid(bounds, T, C, q.device, resets, x.v.dtype)
    N = grid.num_chunks

    def chunked(t: torch.Tensor, groups: int) -> torch.Tensor:
        if grid.token_index is None:
            pad = N * C - T
            if pad:
                t = F.pad(t, (0, 0, 0, pad) if t.dim() == 4 else (0, pad))
        else:
            t = t.new_zeros(*t.shape[:2], N * C, *t.shape[3:]).index_copy(2, grid.token_index, t)
        return t.reshape(B, Hk, groups, N, C, *t.shape[3:])

    return _Chunked(
        q=chunked(x.q, 1),
        k=chunked(x.k, 1),
        v=chunked(x.v, G),
        g=chunked(x.g, G),
        beta=chunked(x.beta, G),
        seq_len=T,
        grid=grid,
    )


def _outputs(o: torch.Tensor, seq_len: int, grid: ChunkGrid, dtype: torch.dtype) -> torch.Tensor:
    """[B, Hk, G, N, C, V] -> [B, T, Hv, V] in `dtype`."""
    B, Hk, G, N, C, V = o.shape
    o = o.reshape(B, Hk * G, N * C, V)
    o = o[:, :, :seq_len] if grid.token_index is None else o.index_select(2, grid.token_index)
    return o.transpose(1, 2).to(dtype)


def _segment_states(
    state: torch.Tensor | None, like: torch.Tensor, segments: int, k_dim: int
) -> torch.Tensor:
    """[B, Hv, K, V] (one segment) or [B, n, Hv, K, V] -> [B, Hk, G, n, K, V] in the dtype and grouping of
    `like` (v or U, [B, Hk, G, N, C, V]); None -> zeros."""
    batch, hk, group, v_dim = (*like.shape[:3], like.shape[-1])
    if state is None:
        return like.new_zeros(batch, hk, group, segments, k_dim, v_dim)
    state = state.to(like.dtype)
    if state.dim() == 4:
        state = state.unsqueeze(1)
    return state.reshape(batch, segments, hk, group, k_dim, v_dim).permute(0, 2, 3, 1, 4, 5)


def _segment_results(final: torch.Tensor, per_segment: bool) -> torch.Tensor:
    """[B, Hk, G, n, K, V] -> [B, n, Hv, K, V] (per_segment) or [B, Hv, K, V] (one segment)."""
    B, Hk, G, n, K, V = final.shape
    final = final.permute(0, 3, 1, 2, 4, 5).reshape(B, n, Hk * G, K, V)
    return final if per_segment else final[:, 0]


def _check_resets(resets: Sequence[int], seq_len: int) -> None:
    if any(not 0 <= r < seq_len for r in resets):
        raise ValueError(f"resets must be token positions in [0, T = {seq_len}), got {list(resets)}")


def _check_state_shape(state: torch.Tensor | None, expected: tuple[int, ...], what: str) -> None:
    if state is not None and tuple(state.shape) != expected:
        raise ValueError(f"initial_state must be {what} = {list(expected)}, got {list(state.shape)}")


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
        q: [B, T, Hk, K]
        k: [B, T, Hk, K]
        v: [B, T, Hv, V]
        g: [B, T, Hv] log-decay (<= 0)
        beta: [B, T, Hv]
        scale: multiplies q; default K ** -0.5
        use_qk_l2norm_in_kernel: L2-normalise q and k first
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
    _check_chunk_size(chunk_size)
    bounds = None if cu_seqlens is None else document_bounds(cu_seqlens, q.shape[1])
    _check_resets(resets, q.shape[1])
    x = _chunked_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, chunk_size, bounds, resets)
    q_decayed, k_tail, w, u, attn, decay = _PrepareChunks.apply(
        x.q, x.k, x.v, x.g.cumsum(-1), x.beta, x.grid.masks
    )
    return ChunkIntermediates(
        q_decayed=q_decayed,
        k_tail_grouped=k_tail,
        w_grouped=w,
        u_grouped=u,
        attn_grouped=attn,
        decay_grouped=decay,
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
    _check_state_shape(initial_state, expected, "[B, n, Hv, K, V]" if chunks.per_segment else "[B, Hv, K, V]")
    h0 = _segment_states(initial_state, u, n, K)
    o, final = _ChunkScan.apply(
        chunks.q_decayed,
        chunks.k_tail_grouped,
        w,
        u,
        chunks.attn_grouped,
        chunks.decay_grouped,
        h0,
        chunks.grid,
    )
    final = _segment_results(final, chunks.per_segment) if output_final_state else None
    return _outputs(o, chunks.seq_len, chunks.grid, chunks.dtype), final


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
        h = _segment_states(entering, self.free, self.grid.num_segments, K)  # [B, Hk, G, n, K, V]
        o = self.free + self.q_eff @ h.index_select(3, self.grid.chunk_segments(h.device))
        final = None
        if output_final_state:
            final = _segment_results(self.final_free + self.final_map @ h, self.per_segment)
        return _outputs(o, self.seq_len, self.grid, self.dtype), final


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
    _check_state_shape(fresh_state, expected, "[B, n, Hv, K, V]" if chunks.per_segment else "[B, Hv, K, V]")
    carried = torch.ones(n, dtype=torch.bool, device=u.device) if carried is None else carried.to(u.device)
    keep = carried.view(1, 1, 1, n, 1, 1)
    fresh = torch.where(keep, 0.0, _segment_states(fresh_state, u, n, K))
    eye = torch.eye(K, dtype=u.dtype, device=u.device).expand(B, Hk, G, n, K, K)
    h0 = torch.cat([fresh, torch.where(keep, eye, 0.0)], dim=-1)
    u_ext = torch.cat([u, u.new_zeros(*u.shape[:-1], K)], dim=-1)
    o, final = _ChunkScan.apply(
        chunks.q_decayed, chunks.k_tail_grouped, w, u_ext, chunks.attn_grouped, chunks.decay_grouped, h0, grid
    )
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

    Args:
        q: [B, T, Hk, K]
        k: [B, T, Hk, K]
        v: [B, T, Hv, V]
        g: [B, T, Hv] log-decay (<= 0)
        beta: [B, T, Hv]
        scale: multiplies q; default K ** -0.5
        initial_state: [B, Hv, K, V], or [n, Hv, K, V] with cu_seqlens (one per document), or None (zeros)
        output_final_state: also return the final state(s), shaped like initial_state
        use_qk_l2norm_in_kernel: L2-normalise q and k first
        cu_seqlens: [n + 1] LongTensor of document boundaries in a packed batch (B = 1), as in FLA: the state
            restarts at every document. Without initial or final states the documents share chunks (no
            padding); with them every document gets chunks of its own (FLA's layout)
        chunk_size: C; any T works
    Returns:
        o [B, T, Hv, V] in q's dtype; the final state(s) in the accumulation dtype, or None.
    """
    check_gdn_inputs(q, k, v, g, beta)
    _check_chunk_size(chunk_size)
    B, T, _, K = k.shape
    Hv, V = v.shape[2], v.shape[3]
    bounds, resets = None, ()
    if cu_seqlens is not None:
        check_packed_batch(B)
        bounds = document_bounds(cu_seqlens, T)
        _check_state_shape(initial_state, (len(bounds) - 1, Hv, K, V), "[n, Hv, K, V] (one per document)")
        if initial_state is not None:
            initial_state = initial_state.unsqueeze(0)
        elif not output_final_state:
            # No state in or out per document: documents share chunks (resets), with no padding.
            bounds, resets = None, bounds[1:-1]
    else:
        _check_state_shape(initial_state, (B, Hv, K, V), "[B, Hv, K, V]")
    x = _chunked_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, chunk_size, bounds, resets)
    h0 = _segment_states(initial_state, x.v, x.grid.num_segments, K)
    o, final = _ChunkGatedDeltaRule.apply(x.q, x.k, x.v, x.g.cumsum(-1), x.beta, h0, x.grid)
    if output_final_state:
        final = _segment_results(final, per_segment=bounds is not None)
        final = final[0] if bounds is not None else final
    else:
        final = None
    return _outputs(o, x.seq_len, x.grid, q.dtype), final
