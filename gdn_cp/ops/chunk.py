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

Every Python loop is over chunks with constant work per step, and the backward writes each gradient once:
O(T) in forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

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


def _decays(gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Gamma [..., C, C], e^gamma, e^(gamma_C - gamma), e^gamma_C [...]) of cumulative log-decays
    [..., C]."""
    C = gamma.shape[-1]
    upper = torch.ones(C, C, dtype=torch.bool, device=gamma.device).triu(1)
    # Mask before exp: above the diagonal gamma_i - gamma_j > 0 and could overflow.
    Gamma = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(upper, float("-inf")).exp()
    last = gamma[..., -1:]
    return Gamma, gamma.exp(), (last - gamma).exp(), last.squeeze(-1).exp()


def _prepare_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    A: torch.Tensor | None = None,
    decays: tuple[torch.Tensor, ...] | None = None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Intermediates (Qg, Kt, W, U, P, decay) and A of chunked inputs (A computed unless given).

    Args:
        q, k: [B, Hk, 1, N, C, K];  v: [B, Hk, G, N, C, V];  gamma (cumulative in each chunk), beta:
        [B, Hk, G, N, C];  A: [B, Hk, G, N, C, C];  decays: `_decays(gamma)` when the caller has it
    """
    Gamma, e_gamma, e_tail, decay = _decays(gamma) if decays is None else decays
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
    attn: torch.Tensor | None = None,
    decays: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """Gradients of (q, k, v, gamma, beta) from those of (Qg, Kt, W, U, P, decay); any of them may be None.

    Shapes as `_prepare_fwd`; dq and dk come back summed over the group ([B, Hk, 1, ...]). An input that
    none of the given gradients reads gets None (a state summary reads neither q nor, through P, Qg).
    Products with q or k, which the group shares, are taken once per key head on the group's summed
    gradient. attn (P) and decays (`_decays(gamma)`): when the caller has them (else recomputed).
    """
    q, k, v, gamma, beta = saved
    d_qd, d_kt, d_w, d_u, d_attn, d_decay = grads
    Gamma, e_gamma, e_tail, decay = _decays(gamma) if decays is None else decays
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
    def forward(ctx, q, k, v, gamma, beta):
        out, A = _prepare_fwd(q, k, v, gamma, beta)
        ctx.save_for_backward(q, k, v, gamma, beta, A)
        ctx.set_materialize_grads(False)  # unused intermediates (a summary reads four) stay None
        return out

    @staticmethod
    def backward(ctx, *grads):
        *saved, A = ctx.saved_tensors
        return _prepare_bwd(tuple(saved), A, grads)


# ---------------------------------------------------------------------------------------------------------
# scan: intermediates and an entering state -> outputs and the leaving state


def _scan_states(
    k_tail: torch.Tensor, w: torch.Tensor, u: torch.Tensor, decay: torch.Tensor, h0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(states entering each chunk [..., N, K, V], v_new [..., N, C, V], final state [..., K, V]).

    Runs inside autograd Functions (no graph), so results go straight into preallocated tensors.
    """
    N = u.shape[3]
    states = h0.new_empty(*h0.shape[:3], N, *h0.shape[3:])
    v_new = torch.empty_like(u)
    h = h0
    for n in range(N):
        states[:, :, :, n] = h
        torch.sub(u[:, :, :, n], w[:, :, :, n] @ h, out=v_new[:, :, :, n])
        h = decay[:, :, :, n, None, None] * h + k_tail[:, :, :, n].transpose(-1, -2) @ v_new[:, :, :, n]
    return states, v_new, h


def _scan_fwd(
    inter: tuple[torch.Tensor, ...], h0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o [B, Hk, G, N, C, V], the entering states [B, Hk, G, N, K, V], the final state [B, Hk, G, K, V])."""
    q_decayed, k_tail, w, u, attn, decay = inter
    states, v_new, h = _scan_states(k_tail, w, u, decay, h0)
    return q_decayed @ states + attn @ v_new, states, h


def _scan_bwd(
    inter: tuple[torch.Tensor, ...],
    states: torch.Tensor,
    d_o: torch.Tensor,
    d_final: torch.Tensor,
    v_new: torch.Tensor | None = None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Gradients of the intermediates (Qg, Kt, W, U, P, decay) and of the entering state h0.

    The reverse scan runs over chunks: dH_in = Qg^T dO - W^T (P^T dO) + e^gamma_C dH_out - W^T (Kt dH_out);
    everything else is batched over chunks afterwards. v_new: U - W H, when the caller has it.
    """
    q_decayed, k_tail, w, u, attn, decay = inter
    d_v_local = attn.transpose(-1, -2) @ d_o  # the part of dv_new that does not go through later states
    wT = w.transpose(-1, -2)
    local = q_decayed.transpose(-1, -2) @ d_o - wT @ d_v_local  # [.., N, K, V]
    dh = d_final
    d_h_out = torch.empty_like(states)  # the gradient of the state leaving each chunk
    for n in range(w.shape[3] - 1, -1, -1):
        d_h_out[:, :, :, n] = dh
        dh = (
            local[:, :, :, n]
            + decay[:, :, :, n, None, None] * dh
            - wT[:, :, :, n] @ (k_tail[:, :, :, n] @ dh)
        )
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
    def forward(ctx, q_decayed, k_tail, w, u, attn, decay, h0):
        inter = (q_decayed, k_tail, w, u, attn, decay)
        o, states, h = _scan_fwd(inter, h0)
        ctx.save_for_backward(*inter, states)
        return o, h

    @staticmethod
    def backward(ctx, d_o, d_final):
        *inter, states = ctx.saved_tensors
        w, u = inter[2], inter[3]
        d_o = torch.zeros_like(u) if d_o is None else d_o
        d_final = u.new_zeros(*u.shape[:3], w.shape[-1], u.shape[-1]) if d_final is None else d_final
        grads, dh0 = _scan_bwd(tuple(inter), states, d_o, d_final)
        return (*grads, dh0)


# ---------------------------------------------------------------------------------------------------------
# the fused op: prepare + scan, saving inputs and A only


class _ChunkGatedDeltaRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gamma, beta, h0):
        # Block by block of chunks, so that the intermediates of one block at a time are alive; kept: the
        # outputs, A, and the state entering every block.
        # q and k arrive as strided views of [B, T, Hk, K] and feed every product: one copy each here (the
        # viewed tensors are then free); v, g, beta enter elementwise only and stay views.
        q, k = q.contiguous(), k.contiguous()
        B, Hk, G, N, C, _ = v.shape
        o = torch.empty_like(v)
        A = v.new_empty(B, Hk, G, N, C, C)
        # The state entering every backward block, taken from the chunk states of each forward block.
        block_states = h0.new_empty(B, Hk, G, -(-N // BACKWARD_BLOCK), *h0.shape[-2:])
        h = h0
        for lo in range(0, N, FORWARD_BLOCK):
            span = slice(lo, lo + FORWARD_BLOCK)
            inter, A[:, :, :, span] = _prepare_fwd(*(t[:, :, :, span] for t in (q, k, v, gamma, beta)))
            o[:, :, :, span], states, h = _scan_fwd(inter, h)
            first = lo // BACKWARD_BLOCK
            kept = states[:, :, :, ::BACKWARD_BLOCK]
            block_states[:, :, :, first : first + kept.shape[3]] = kept
        ctx.save_for_backward(q, k, v, gamma, beta, A, block_states)
        return o, h

    @staticmethod
    def backward(ctx, d_o, d_final):
        q, k, v, gamma, beta, A, block_states = ctx.saved_tensors
        d_o = torch.zeros_like(v) if d_o is None else d_o
        dh = v.new_zeros(*v.shape[:3], k.shape[-1], v.shape[-1]) if d_final is None else d_final
        # Each block's gradients are written once into their place (no autograd here, so in place is O(T)).
        out = [torch.empty_like(t) for t in (q, k, v, gamma, beta)]
        for b in range(block_states.shape[3] - 1, -1, -1):
            span = slice(b * BACKWARD_BLOCK, (b + 1) * BACKWARD_BLOCK)
            *inputs, A_block, d_o_block = (t[:, :, :, span] for t in (q, k, v, gamma, beta, A, d_o))
            # dO arrives as a strided view of the caller's [B, T, Hv, V]: one copy of the block, not one per
            # product that reads it.
            d_o_block = d_o_block.contiguous()
            decays = _decays(inputs[3])
            inter, _ = _prepare_fwd(*inputs, A=A_block, decays=decays)
            states, v_new, _ = _scan_states(inter[1], inter[2], inter[3], inter[5], block_states[:, :, :, b])
            grads, dh = _scan_bwd(inter, states, d_o_block, dh, v_new)
            for full, part in zip(
                out, _prepare_bwd(tuple(inputs), A_block, grads, attn=inter[4], decays=decays), strict=True
            ):
                full[:, :, :, span] = part
        return (*out, dh)


# ---------------------------------------------------------------------------------------------------------
# public API


@dataclass(frozen=True, slots=True)
class _Chunked:
    """Inputs of the pieces: head-major, padded to N chunks, grouped, in the accumulation dtype."""

    q: torch.Tensor  # [B, Hk, 1, N, C, K]
    k: torch.Tensor  # [B, Hk, 1, N, C, K]
    v: torch.Tensor  # [B, Hk, G, N, C, V]
    g: torch.Tensor  # [B, Hk, G, N, C]  (per token; cumulated inside each chunk by the caller)
    beta: torch.Tensor  # [B, Hk, G, N, C]
    seq_len: int


def _chunked_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    use_qk_l2norm_in_kernel: bool,
    chunk_size: int,
) -> _Chunked:
    """Normalise, cast and lay out the inputs; the tail is padded with g = 0 and beta = 0, which leaves the
    state untouched."""
    x = head_major_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel)
    B, Hk, T, _ = x.k.shape
    G = x.v.shape[1] // Hk
    C = chunk_size
    pad = (-T) % C
    N = (T + pad) // C

    def chunked(t: torch.Tensor, groups: int) -> torch.Tensor:
        if pad:
            t = F.pad(t, (0, 0, 0, pad) if t.dim() == 4 else (0, pad))
        return t.reshape(B, Hk, groups, N, C, *t.shape[3:])

    return _Chunked(
        q=chunked(x.q, 1),
        k=chunked(x.k, 1),
        v=chunked(x.v, G),
        g=chunked(x.g, G),
        beta=chunked(x.beta, G),
        seq_len=T,
    )


def _outputs(o: torch.Tensor, seq_len: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, Hk, G, N, C, V] -> [B, T, Hv, V] in `dtype`."""
    B, Hk, G, N, C, V = o.shape
    return o.reshape(B, Hk * G, N * C, V)[:, :, :seq_len].transpose(1, 2).to(dtype)


def prepare_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
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
    Returns:
        ChunkIntermediates with N = ceil(T / C) chunks.
    """
    check_gdn_inputs(q, k, v, g, beta)
    _check_chunk_size(chunk_size)
    x = _chunked_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, chunk_size)
    q_decayed, k_tail, w, u, attn, decay = _PrepareChunks.apply(x.q, x.k, x.v, x.g.cumsum(-1), x.beta)
    return ChunkIntermediates(
        q_decayed=q_decayed,
        k_tail_grouped=k_tail,
        w_grouped=w,
        u_grouped=u,
        attn_grouped=attn,
        decay_grouped=decay,
        seq_len=x.seq_len,
        dtype=q.dtype,
    )


def chunk_outputs(
    chunks: ChunkIntermediates,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Outputs of prepared chunks given the state entering the first one.

    Args:
        chunks: from `prepare_chunks`
        initial_state: [B, Hv, K, V] or None (zeros)
        output_final_state: also return the state after the last token
    Returns:
        o [B, T, Hv, V] in the inputs' dtype; final state [B, Hv, K, V] in the accumulation dtype, or None.
    """
    w, u = chunks.w_grouped, chunks.u_grouped
    B, Hk, G, K, V = (*w.shape[:3], w.shape[-1], u.shape[-1])
    if initial_state is None:
        h0 = u.new_zeros(B, Hk, G, K, V)
    elif tuple(initial_state.shape) != (B, Hk * G, K, V):
        raise ValueError(
            f"initial_state must be [B, Hv, K, V] = {[B, Hk * G, K, V]}, got {list(initial_state.shape)}"
        )
    else:
        h0 = initial_state.to(u.dtype).reshape(B, Hk, G, K, V)
    o, h = _ChunkScan.apply(
        chunks.q_decayed, chunks.k_tail_grouped, w, u, chunks.attn_grouped, chunks.decay_grouped, h0
    )
    final = h.reshape(B, Hk * G, K, V) if output_final_state else None
    return _outputs(o, chunks.seq_len, chunks.dtype), final


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
        initial_state: [B, Hv, K, V] or None (zeros)
        output_final_state: also return H_T
        use_qk_l2norm_in_kernel: L2-normalise q and k first
        chunk_size: C; any T works
    Returns:
        o [B, T, Hv, V] in q's dtype; H_T [B, Hv, K, V] in the accumulation dtype, or None.
    """
    check_gdn_inputs(q, k, v, g, beta, initial_state)
    _check_chunk_size(chunk_size)
    x = _chunked_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, chunk_size)
    B, Hk, G = x.v.shape[:3]
    K, V = x.k.shape[-1], x.v.shape[-1]
    if initial_state is None:
        h0 = x.v.new_zeros(B, Hk, G, K, V)
    else:
        h0 = initial_state.to(x.v.dtype).reshape(B, Hk, G, K, V)
    o, h = _ChunkGatedDeltaRule.apply(x.q, x.k, x.v, x.g.cumsum(-1), x.beta, h0)
    final = h.reshape(B, Hk * G, K, V) if output_final_state else None
    return _outputs(o, x.seq_len, q.dtype), final
