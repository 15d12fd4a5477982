"""Affine state summaries: a segment of tokens as one map H -> M @ H + S, and the algebra on such maps.

Every token maps the state affinely, so a chunk, or a whole rank's shard, is one affine map (S, M) with
S [B, Hv, K, V] and M [B, Hv, K, K]. Maps compose associatively,
    (S2, M2) after (S1, M1) = (M2 S1 + S2, M2 M1),
which lets ranks summarise their shards in parallel and combine them in any grouping.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.checkpoint import checkpoint

from gdn_cp.ops.chunk import ChunkIntermediates

Summary = tuple[torch.Tensor, torch.Tensor]
"""(S [..., K, V], M [..., K, K])."""


def apply_summary(summary: Summary, state: torch.Tensor) -> torch.Tensor:
    """M @ state + S: the state after the summarised segment. state [..., K, V] -> [..., K, V]."""
    S, M = summary
    return M @ state.to(S.dtype) + S


def compose_summaries(first: Summary, second: Summary) -> Summary:
    """The summary of `first` followed by `second`: (M2 S1 + S2, M2 M1). Any matching leading dims."""
    S1, M1 = first
    S2, M2 = second
    return M2 @ S1 + S2, M2 @ M1


def fold_summaries(summaries: Sequence[Summary], initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """The state after the segments of `summaries`, in order, starting from `initial_state` (zeros if None).

    Args:
        summaries: (S [B, Hv, K, V], M [B, Hv, K, K]) per segment, earliest first
        initial_state: [B, Hv, K, V] or None
    Returns:
        [B, Hv, K, V]
    """
    if not summaries:
        if initial_state is None:
            raise ValueError("fold_summaries: no summaries and no initial_state; the state shape is unknown")
        return initial_state
    state = summaries[0][0] if initial_state is None else apply_summary(summaries[0], initial_state)
    for summary in summaries[1:]:
        state = apply_summary(summary, state)
    return state


def pack_summary(S: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """[S | M] as one tensor, for a single collective: [B, Hv, K, V], [B, Hv, K, K] -> [B, Hv, K, V + K]."""
    return torch.cat([S, M], dim=-1)


def unpack_summary(packed: torch.Tensor, v_dim: int) -> Summary:
    """Inverse of `pack_summary`: [..., K, V + K] -> (S [..., K, V], M [..., K, K])."""
    return packed[..., :v_dim], packed[..., v_dim:]


def _reduce_chunk_summaries(
    w: torch.Tensor, u: torch.Tensor, k_tail: torch.Tensor, decay: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-chunk maps (S_c = Kt^T U, M_c = e^{gamma_C} I - Kt^T W), then a log-depth pairwise reduction."""
    B, H, N, _, K = w.shape
    kt = k_tail.transpose(-1, -2)
    eye = torch.eye(K, dtype=w.dtype, device=w.device)
    S = kt @ u
    M = decay[..., None, None] * eye - kt @ w
    if N == 0:
        return u.new_zeros(B, H, K, u.shape[-1]), eye.expand(B, H, K, K).clone()
    # Pair neighbours (2i, 2i+1) until one map is left; an odd one out waits at the end for the next level.
    while S.shape[2] > 1:
        n = S.shape[2]
        even = n - n % 2
        S_pair, M_pair = compose_summaries(
            (S[:, :, 0:even:2], M[:, :, 0:even:2]), (S[:, :, 1:even:2], M[:, :, 1:even:2])
        )
        if n % 2:
            S_pair = torch.cat([S_pair, S[:, :, -1:]], dim=2)
            M_pair = torch.cat([M_pair, M[:, :, -1:]], dim=2)
        S, M = S_pair, M_pair
    return S[:, :, 0], M[:, :, 0]


def gdn_state_summary(
    chunks: ChunkIntermediates, checkpoint_summary: bool = False, segment: int = -1
) -> Summary:
    """The affine map of one prepared segment (by default the last, or the only one): the state leaving it
    is M @ H + S for the state H entering it.

    Args:
        chunks: from `prepare_chunks`
        checkpoint_summary: compute under non-reentrant activation checkpointing, so the forward keeps no
            per-chunk graph and the backward recomputes it (less peak memory, a little more time); values
            and gradients are the same.
        segment: which segment (of cu_seqlens in `prepare_chunks`), Python indexing
    Returns:
        (S [B, Hv, K, V], M [B, Hv, K, K]) in the accumulation dtype.
    """
    offsets = chunks.grid.chunk_offsets
    span = slice(offsets[:-1][segment], offsets[1:][segment])
    args = (chunks.w[:, :, span], chunks.u[:, :, span], chunks.k_tail[:, :, span], chunks.decay[:, :, span])
    if checkpoint_summary:
        return checkpoint(_reduce_chunk_summaries, *args, use_reentrant=False)
    return _reduce_chunk_summaries(*args)
