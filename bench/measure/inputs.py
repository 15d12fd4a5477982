"""A case's input and output gradient, drawn by each rank for its own tokens alone.

The global tensors [B, T, hidden] are defined block by block: the positions [j * BLOCK_TOKENS, (j + 1) *
BLOCK_TOKENS) of stream s are drawn from a CPU generator seeded by (seed, s, j), so a rank draws the blocks
its shard touches and nothing else: host memory and RNG time per case-round follow the tokens per rank, not
the global sequence (at 256K tokens x hidden 2048 the global pair is 4 GiB in fp32 per rank). Any cp and
layout sees slices of the same global tensors, which `global_tensor` assembles whole (tests, references).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gdn_cp.distributed.layout import piece_owners

BLOCK_TOKENS = 256
"""Positions per seeded block: small enough that a shard draws little beyond its own tokens, large enough
that seeding a generator per block costs nothing beside the draw."""
INPUT, OUTPUT_GRAD = 0, 1
"""The streams: the layer's input, and the gradient its output receives."""


def _block_seed(seed: int, stream: int, block: int) -> int:
    # distinct (seed, stream, block) -> distinct generator seeds (64-bit, non-negative)
    return ((seed * 1_000_003 + stream) * 1_000_003 + block) % (2**63)


def local_ranges(seq_len: int, cp: int, rank: int, layout: str) -> list[tuple[int, int]]:
    """The global positions [lo, hi) of `rank`'s shard, in the order the shard holds them (contiguous: one
    range; zigzag: pieces r and 2 cp - 1 - r). The split must be even (the preflight checks it)."""
    owners = piece_owners(layout, cp)
    piece = seq_len // len(owners)
    return [(i * piece, (i + 1) * piece) for i, owner in enumerate(owners) if owner == rank]


def shard_tensor(
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    *,
    seed: int,
    stream: int,
    ranges: Sequence[tuple[int, int]],
) -> torch.Tensor:
    """[B, sum of the ranges' lengths, hidden]: the global tensor of `stream` (shape [B, T, hidden]) at
    `ranges`, concatenated in order, on the CPU, in `dtype` (drawn in fp32: the same values at any dtype's
    rounding)."""
    B, T, hidden = shape
    parts = []
    for lo, hi in ranges:
        if not 0 <= lo < hi <= T:
            raise ValueError(f"positions [{lo}, {hi}) are not inside a sequence of {T} tokens")
        for block in range(lo // BLOCK_TOKENS, (hi - 1) // BLOCK_TOKENS + 1):
            generator = torch.Generator().manual_seed(_block_seed(seed, stream, block))
            drawn = torch.randn(B, BLOCK_TOKENS, hidden, generator=generator, dtype=torch.float32)
            start = block * BLOCK_TOKENS
            parts.append(drawn[:, max(lo, start) - start : min(hi, start + BLOCK_TOKENS) - start])
    return torch.cat(parts, dim=1).to(dtype)


def global_tensor(shape: tuple[int, int, int], dtype: torch.dtype, *, seed: int, stream: int) -> torch.Tensor:
    """[B, T, hidden] the whole global tensor of `stream` (what every rank's shard is a slice of)."""
    return shard_tensor(shape, dtype, seed=seed, stream=stream, ranges=[(0, shape[1])])
