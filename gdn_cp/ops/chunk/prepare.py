"""Stage 1 of the chunked GDN, the UT transform (FLA's wy_fast, with the chunk's Q K^T): chunked inputs ->
the state-independent intermediates Qg, Kt, W, U, P and the chunk decays, and A = (I + L)^-1; the backward
from the intermediates' gradients to the inputs'. The inverse is matmul-only (gdn_cp.ops.triangular), so no
triangular solve runs forward or backward.
"""

from __future__ import annotations

import torch

from gdn_cp.ops.chunk.intermediates import ChunkInputs, Prepared
from gdn_cp.ops.documents import ResetMasks
from gdn_cp.ops.triangular import unit_lower_inverse


def check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")


def chunk_decays(
    gamma: torch.Tensor, masks: ResetMasks | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Gamma [..., C, C], e^gamma, e^(gamma_C - gamma), e^gamma_C [...]) of cumulative log-decays
    [..., N, C]; with `masks` (documents sharing chunks), each masked to what stays inside a document.

    The masks are constants multiplying exponentials, so every gradient formula of `prepare_bwd`, written
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


def ut_transform(inputs: ChunkInputs, decays: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """A = (I + strict_lower(diag(beta) K K^T * Gamma))^-1 [B, Hk, G, N, C, C] of chunked inputs (shapes as
    `prepare_fwd`'s); decays: `chunk_decays(gamma, masks)`."""
    k = inputs.k
    return unit_lower_inverse((k @ k.transpose(-1, -2)) * decays[0] * inputs.beta[..., None])


def prepare_fwd(
    inputs: ChunkInputs,
    decays: tuple[torch.Tensor, ...],
    A: torch.Tensor | None = None,
    fields: frozenset[str] = frozenset(Prepared._fields),
) -> tuple[Prepared, torch.Tensor]:
    """The intermediates and A of chunked inputs (A computed unless given).

    Args:
        inputs: q, k [B, Hk, 1, N, C, K]; v [B, Hk, G, N, C, V]; gamma (cumulative in each chunk), beta
            [B, Hk, G, N, C]
        decays: `chunk_decays(gamma, masks)`
        A: [B, Hk, G, N, C, C]
        fields: the intermediates to compute (names of Prepared); the others are None (a state summary
            reads neither Qg nor P, the backward's pre-pass not U)
    """
    q, k, v, beta = inputs.q, inputs.k, inputs.v, inputs.beta  # gamma enters through `decays`
    Gamma, e_gamma, e_tail, decay = decays
    if A is None:
        A = ut_transform(inputs, decays)
    w = A @ (k * (beta * e_gamma)[..., None]) if "w" in fields else None
    u = A @ (v * beta[..., None]) if "u" in fields else None
    attn = (q @ k.transpose(-1, -2)) * Gamma if "attn" in fields else None
    q_decayed = q * e_gamma[..., None] if "q_decayed" in fields else None
    k_tail = k * e_tail[..., None] if "k_tail" in fields else None
    return Prepared(q_decayed=q_decayed, k_tail=k_tail, w=w, u=u, attn=attn, decay=decay), A


def prepare_bwd(
    inputs: ChunkInputs,
    A: torch.Tensor,
    grads: Prepared,
    decays: tuple[torch.Tensor, ...],
    attn: torch.Tensor | None = None,
) -> ChunkInputs:
    """The inputs' gradients from the intermediates' (`grads`, any of them None).

    Shapes as `prepare_fwd`; dq and dk come back summed over the group ([B, Hk, 1, ...]). An input that
    none of the given gradients reads gets None (a state summary reads neither q nor, through P, Qg).
    Products with q or k, which the group shares, are taken once per key head on the group's summed
    gradient. decays: `chunk_decays(gamma, masks)`; attn (P): when the caller has it (else recomputed).
    """
    q, k, _, gamma, beta = inputs
    Gamma, e_gamma, _, _ = decays
    per_head = torch.broadcast_shapes(q.shape[:-1], gamma.shape)
    # dk and d_gamma accumulate in place, each term in the order of the forward's intermediates.
    dk = q.new_zeros(*per_head, q.shape[-1])  # elementwise parts, per value head
    d_gamma = torch.zeros_like(gamma)
    dq, d_last = _add_scaling_grads(inputs, grads, decays, dk, d_gamma)
    dq_shared = dk_shared = None  # parts already summed over the group, [B, Hk, 1, N, C, K]
    if grads.attn is not None:  # P = q k^T * Gamma
        dq_shared, dk_shared = _add_attn_grads(q, k, Gamma, grads.attn, attn, d_gamma)
    dv = d_beta = None
    if grads.w is not None or grads.u is not None:  # W = A (beta e^gamma k), U = A (beta v)
        dv, d_beta, d_A = _add_wu_grads(inputs, A, e_gamma, grads, dk, d_gamma)
        d_kk = _add_inverse_grads(k, beta, Gamma, A, d_A, d_beta, d_gamma)
        dk_shared = -d_kk if dk_shared is None else dk_shared - d_kk

    d_gamma[..., -1] += d_last  # gamma_C is the last position's gamma
    dk = dk.sum(2, keepdim=True)
    if dq_shared is not None:
        dq = dq_shared if dq is None else dq + dq_shared
    if dk_shared is not None:
        dk += dk_shared
    return ChunkInputs(q=dq, k=dk, v=dv, gamma=d_gamma, beta=d_beta)


def _add_scaling_grads(
    inputs: ChunkInputs,
    grads: Prepared,
    decays: tuple[torch.Tensor, ...],
    dk: torch.Tensor,
    d_gamma: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(dq [B, Hk, 1, N, C, K] or None, d gamma_C [B, Hk, G, N]) via Qg, Kt, decay; adds to dk, d_gamma."""
    q, k, gamma = inputs.q, inputs.k, inputs.gamma
    d_qd, d_kt, d_decay = grads.q_decayed, grads.k_tail, grads.decay
    _, e_gamma, e_tail, decay = decays
    dq = None
    # Kept apart from d_gamma until every other term is in (prepare_bwd adds it last).
    d_last = torch.zeros_like(gamma[..., 0])
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
    return dq, d_last


def _add_attn_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    Gamma: torch.Tensor,
    d_attn: torch.Tensor,
    attn: torch.Tensor | None,
    d_gamma: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, dk) [B, Hk, 1, N, C, K] via P = q k^T * Gamma, summed over the group; adds to d_gamma."""
    d_qk = d_attn * Gamma
    E = d_attn * ((q @ k.transpose(-1, -2)) * Gamma if attn is None else attn)
    d_gamma += E.sum(-1) - E.sum(-2)
    d_qk = d_qk.sum(2, keepdim=True)
    return d_qk @ k, d_qk.transpose(-1, -2) @ q


def _add_wu_grads(
    inputs: ChunkInputs,
    A: torch.Tensor,
    e_gamma: torch.Tensor,
    grads: Prepared,
    dk: torch.Tensor,
    d_gamma: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(dv [B, Hk, G, N, C, V] or None, d_beta [B, Hk, G, N, C], dA) via W and U; adds to dk, d_gamma."""
    k, v, beta = inputs.k, inputs.v, inputs.beta
    d_w, d_u = grads.w, grads.u
    be = beta * e_gamma
    rhs, d_rhs = [], []  # W and U share A: one product for both
    if d_w is not None:
        rhs.append(k * be[..., None])
        d_rhs.append(d_w)
    if d_u is not None:
        rhs.append(v * beta[..., None])
        d_rhs.append(d_u)
    d_out = torch.cat(d_rhs, -1) if len(d_rhs) > 1 else d_rhs[0]
    d_A = d_out @ (torch.cat(rhs, -1) if len(rhs) > 1 else rhs[0]).transpose(-1, -2)
    d_in = A.transpose(-1, -2) @ d_out
    d_beta = torch.zeros_like(beta)
    dv = None
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
    return dv, d_beta, d_A


def _add_inverse_grads(
    k: torch.Tensor,
    beta: torch.Tensor,
    Gamma: torch.Tensor,
    A: torch.Tensor,
    d_A: torch.Tensor,
    d_beta: torch.Tensor,
    d_gamma: torch.Tensor,
) -> torch.Tensor:
    """d(k k^T) k [B, Hk, 1, N, C, K], summed over the group, via A = (I + L)^-1; adds to d_beta, d_gamma."""
    AT = A.transpose(-1, -2)
    # A = (I + L)^-1  =>  dL = -A^T dA A^T on the strict lower triangle where L lives; minus_dL holds
    # -dL, the sign folded into its uses.
    minus_dL = (AT @ d_A @ AT).tril(-1)
    kk_gamma = (k @ k.transpose(-1, -2)) * Gamma
    d_beta -= (minus_dL * kk_gamma).sum(-1)
    E = minus_dL * kk_gamma * beta[..., None]
    d_gamma -= E.sum(-1) - E.sum(-2)
    d_kk = (minus_dL * Gamma * beta[..., None]).sum(2, keepdim=True)
    return (d_kk + d_kk.transpose(-1, -2)) @ k


class PrepareChunks(torch.autograd.Function):
    """prepare_fwd / prepare_bwd as a Function: saves the inputs and A; intermediates no gradient reaches
    (a summary reads four of the six) stay None in the backward."""

    @staticmethod
    def forward(ctx, q, k, v, gamma, beta, masks):
        inputs = ChunkInputs(q=q, k=k, v=v, gamma=gamma, beta=beta)
        prepared, A = prepare_fwd(inputs, chunk_decays(gamma, masks))
        ctx.save_for_backward(q, k, v, gamma, beta, A)
        ctx.masks = masks
        ctx.set_materialize_grads(False)
        return tuple(prepared)

    @staticmethod
    def backward(ctx, *grads):
        *saved, A = ctx.saved_tensors
        inputs = ChunkInputs(*saved)
        d_inputs = prepare_bwd(inputs, A, Prepared(*grads), chunk_decays(inputs.gamma, ctx.masks))
        return (*d_inputs, None)
