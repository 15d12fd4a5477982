"""How the chunk stages see the op's tensors: inputs normalised, cast, head-major and cut into chunks of the
grid (segments and resets of packed documents, gdn_cp.ops.documents), states grouped per segment, and the
outputs put back as [B, T, Hv, V].

Layout: [B, Hk, G, N, C, ...], value heads grouped under their key head (G = Hv / Hk), so that q and k
([B, Hk, 1, ...]) broadcast over the group instead of being repeated, and K K^T, Q K^T are computed once per
key head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gdn_cp.ops.chunk.intermediates import ChunkInputs
from gdn_cp.ops.documents import ChunkGrid, chunk_grid
from gdn_cp.ops.inputs import head_major_inputs


@dataclass(frozen=True, slots=True)
class Chunked:
    """Inputs of the pieces: head-major, in chunks (`grid`), grouped, in the accumulation dtype."""

    q: torch.Tensor  # [B, Hk, 1, N, C, K]
    k: torch.Tensor  # [B, Hk, 1, N, C, K]
    v: torch.Tensor  # [B, Hk, G, N, C, V]
    g: torch.Tensor  # [B, Hk, G, N, C]  (per token; cumulated inside each chunk by the caller)
    beta: torch.Tensor  # [B, Hk, G, N, C]
    seq_len: int
    grid: ChunkGrid

    def inputs(self) -> ChunkInputs:
        """The stages' inputs: g cumulated inside each chunk (gamma)."""
        return ChunkInputs(q=self.q, k=self.k, v=self.v, gamma=self.g.cumsum(-1), beta=self.beta)


def chunked_inputs(
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
) -> Chunked:
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

    return Chunked(
        q=chunked(x.q, 1),
        k=chunked(x.k, 1),
        v=chunked(x.v, G),
        g=chunked(x.g, G),
        beta=chunked(x.beta, G),
        seq_len=T,
        grid=grid,
    )


def outputs(o: torch.Tensor, seq_len: int, grid: ChunkGrid, dtype: torch.dtype) -> torch.Tensor:
    """[B, Hk, G, N, C, V] -> [B, T, Hv, V] in `dtype`."""
    B, Hk, G, N, C, V = o.shape
    o = o.reshape(B, Hk * G, N * C, V)
    o = o[:, :, :seq_len] if grid.token_index is None else o.index_select(2, grid.token_index)
    return o.transpose(1, 2).to(dtype)


def segment_states(state: torch.Tensor | None, like: torch.Tensor, segments: int, k_dim: int) -> torch.Tensor:
    """[B, Hv, K, V] (one segment) or [B, n, Hv, K, V] -> [B, Hk, G, n, K, V] in the dtype and grouping of
    `like` (v or U, [B, Hk, G, N, C, V]); None -> zeros."""
    batch, hk, group, v_dim = (*like.shape[:3], like.shape[-1])
    if state is None:
        return like.new_zeros(batch, hk, group, segments, k_dim, v_dim)
    state = state.to(like.dtype)
    if state.dim() == 4:
        state = state.unsqueeze(1)
    return state.reshape(batch, segments, hk, group, k_dim, v_dim).permute(0, 2, 3, 1, 4, 5)


def segment_results(final: torch.Tensor, per_segment: bool) -> torch.Tensor:
    """[B, Hk, G, n, K, V] -> [B, n, Hv, K, V] (per_segment) or [B, Hv, K, V] (one segment)."""
    B, Hk, G, n, K, V = final.shape
    final = final.permute(0, 3, 1, 2, 4, 5).reshape(B, n, Hk * G, K, V)
    return final if per_segment else final[:, 0]


def check_resets(resets: Sequence[int], seq_len: int) -> None:
    if any(not 0 <= r < seq_len for r in resets):
        raise ValueError(f"resets must be token positions in [0, T = {seq_len}), got {list(resets)}")


def check_state_shape(state: torch.Tensor | None, expected: tuple[int, ...], what: str) -> None:
    if state is not None and tuple(state.shape) != expected:
        raise ValueError(f"initial_state must be {what} = {list(expected)}, got {list(state.shape)}")
