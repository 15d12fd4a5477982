"""Chunked (WY / UT-transform) Gated DeltaNet: the fast path, in two halves.

`prepare_chunks` computes everything about a chunk that does not depend on the state entering it (the UT
transform and the W, U, masked QK^T it yields). `chunk_outputs` then runs the short sequential scan over
chunk states and the batched outputs. Context parallelism prepares once and uses the same intermediates
for the rank's state summary (gdn_cp.ops.summary) and, once the entering state arrives, for its outputs.

Math (design.md section 2), per chunk with in-chunk cumulative log-decay gamma:
    Gamma_ij = exp(gamma_i - gamma_j) for i >= j, else 0
    T = (I + strict_lower(diag(beta) K K^T * Gamma))^-1
    W = T (beta * exp(gamma) * K),  U = T (beta * V),  Kt = K * exp(gamma_C - gamma)
    v_new = U - W H,  o = (Q * exp(gamma)) H + (Q K^T * Gamma) v_new,  H' = exp(gamma_C) H + Kt^T v_new

Cost is O(T) in forward and backward: the scan touches chunks through `unbind`/`stack` (one backward op
each), never through per-chunk indexing or in-place writes, whose backward copies the whole sequence per
chunk and grows quadratically (transformers' pure-torch fallback does that).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gdn_cp.ops.inputs import check_gdn_inputs, head_major_inputs


@dataclass(frozen=True, slots=True)
class ChunkIntermediates:
    """The state-independent part of every chunk, in the accumulation dtype (see the module docstring)."""

    q: torch.Tensor
    """[B, Hv, N, C, K] scaled q times exp(gamma): reads the entering state."""
    k_tail: torch.Tensor
    """[B, Hv, N, C, K] k times exp(gamma_C - gamma): writes into the leaving state."""
    w: torch.Tensor
    """[B, Hv, N, C, K] T (beta exp(gamma) K): what the entering state predicts of each value."""
    u: torch.Tensor
    """[B, Hv, N, C, V] T (beta V): the values as written from a zero state."""
    attn: torch.Tensor
    """[B, Hv, N, C, C] Q K^T * Gamma, lower triangle including the diagonal."""
    decay: torch.Tensor
    """[B, Hv, N] exp(gamma_C): decay of the whole chunk."""
    seq_len: int
    """T before padding to a multiple of C."""
    dtype: torch.dtype
    """The caller's dtype: outputs come back in it."""

    @property
    def num_chunks(self) -> int:
        return self.w.shape[2]


def _check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")


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
    x = head_major_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel)
    B, Hk, T, _ = x.k.shape
    Hv = x.v.shape[1]
    G = Hv // Hk
    C = chunk_size
    pad = (-T) % C
    N = (T + pad) // C

    # Work in [B, Hk, G, N, C, ...]: value heads grouped under their key head, so that q and k
    # ([B, Hk, 1, ...]) broadcast over the group instead of being repeated, and K K^T, Q K^T are computed
    # once per key head.
    def chunked(t: torch.Tensor, groups: int) -> torch.Tensor:
        if pad:
            t = F.pad(t, (0, 0, 0, pad) if t.dim() == 4 else (0, pad))
        return t.reshape(B, Hk, groups, N, C, *t.shape[3:])

    qc, kc = chunked(x.q, 1), chunked(x.k, 1)
    vc, gc, bc = chunked(x.v, G), chunked(x.g, G), chunked(x.beta, G)

    gamma = gc.cumsum(-1)
    upper = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    # Mask before exp: above the diagonal gamma_i - gamma_j > 0 and could overflow.
    Gamma = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(upper, float("-inf")).exp()

    # (I + strict_lower(beta K K^T Gamma)) [W | U] = [beta e^gamma K | beta V]. The solver reads only the
    # strict lower triangle (unitriangular); two narrow solves beat one on the concatenated right-hand side.
    system = (kc @ kc.transpose(-1, -2)) * (Gamma * bc[..., None])
    w = torch.linalg.solve_triangular(
        system, kc * (bc * gamma.exp())[..., None], upper=False, unitriangular=True
    )
    u = torch.linalg.solve_triangular(system, vc * bc[..., None], upper=False, unitriangular=True)

    gamma_last = gamma[..., -1:]
    return ChunkIntermediates(
        q=(qc * gamma.exp()[..., None]).flatten(1, 2),
        k_tail=(kc * (gamma_last - gamma).exp()[..., None]).flatten(1, 2),
        w=w.flatten(1, 2),
        u=u.flatten(1, 2),
        attn=((qc @ kc.transpose(-1, -2)) * Gamma).flatten(1, 2),
        decay=gamma_last.squeeze(-1).exp().flatten(1, 2),
        seq_len=T,
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
    B, H, N, C, K = chunks.w.shape
    V = chunks.u.shape[-1]
    if initial_state is None:
        h = chunks.u.new_zeros(B, H, K, V)
    else:
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(
                f"initial_state must be [B, Hv, K, V] = {[B, H, K, V]}, got {list(initial_state.shape)}"
            )
        h = initial_state.to(chunks.u.dtype)
    states, v_news = [], []
    for w, u, k_tail, decay in zip(
        chunks.w.unbind(2), chunks.u.unbind(2), chunks.k_tail.unbind(2), chunks.decay.unbind(2), strict=True
    ):
        states.append(h)
        v_new = u - w @ h
        v_news.append(v_new)
        h = decay[..., None, None] * h + k_tail.transpose(-1, -2) @ v_new
    if N == 0:
        o = chunks.u.new_zeros(B, 0, H, V)
    else:
        o = chunks.q @ torch.stack(states, dim=2) + chunks.attn @ torch.stack(v_news, dim=2)
        o = o.reshape(B, H, N * C, V)[:, :, : chunks.seq_len].transpose(1, 2)
    return o.to(chunks.dtype), (h if output_final_state else None)


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
    chunks = prepare_chunks(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, chunk_size)
    return chunk_outputs(chunks, initial_state, output_final_state)
