"""What the chunk stages hand each other: the prepared intermediates by name (`Prepared`, also their
gradients), the op's inputs in chunks by name (`ChunkInputs`, also their gradients), and the public
`ChunkIntermediates` that context parallelism keeps between preparing and scanning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from gdn_cp.ops.documents import ChunkGrid


class ChunkInputs(NamedTuple):
    """The op's inputs in chunks, [B, Hk, G, N, C, ...] (q, k shared by the group: G = 1), in the
    accumulation dtype; the same names hold their gradients."""

    q: torch.Tensor | None
    """[B, Hk, 1, N, C, K]"""
    k: torch.Tensor | None
    """[B, Hk, 1, N, C, K]"""
    v: torch.Tensor | None
    """[B, Hk, G, N, C, V]"""
    gamma: torch.Tensor | None
    """[B, Hk, G, N, C] log-decay cumulated inside each chunk"""
    beta: torch.Tensor | None
    """[B, Hk, G, N, C]"""


class Prepared(NamedTuple):
    """The state-independent intermediates of every chunk (module docstring of gdn_cp.ops.chunk), grouped
    [B, Hk, G, N, C, ...]; the same names hold their gradients (None: no gradient reaches it)."""

    q_decayed: torch.Tensor | None
    """[..., C, K] Qg = e^gamma Q: reads the entering state."""
    k_tail: torch.Tensor | None
    """[..., C, K] Kt = e^(gamma_C - gamma) K: writes into the leaving state."""
    w: torch.Tensor | None
    """[..., C, K] W = A (beta e^gamma K): what the entering state predicts of each value."""
    u: torch.Tensor | None
    """[..., C, V] U = A (beta V): the values as written from a zero state."""
    attn: torch.Tensor | None
    """[..., C, C] P = Q K^T * Gamma, lower triangle including the diagonal."""
    decay: torch.Tensor | None
    """[B, Hk, G, N] e^gamma_C: decay of the whole chunk."""


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
    def prepared(self) -> Prepared:
        """The grouped intermediates by name, as the scan takes them."""
        return Prepared(
            q_decayed=self.q_decayed,
            k_tail=self.k_tail_grouped,
            w=self.w_grouped,
            u=self.u_grouped,
            attn=self.attn_grouped,
            decay=self.decay_grouped,
        )

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
