"""Where every rank's tokens sit in the global sequence (layouts), and which documents they hold.

Layouts (how the global sequence is cut into pieces and which rank holds which):

    contiguous  rank r holds piece r; the pieces may differ in length (any split, down to one token)
    zigzag      the sequence in 2 cp equal pieces; rank r holds pieces r and 2 cp - 1 - r, concatenated in
                that order (full attention's load-balanced layout: every rank gets the same causal work)

A rank's tokens are its pieces in increasing global order; the state flows through the pieces in global
order, whoever holds them. With packed documents (cu_seqlens, global boundaries), a rank's tokens split
further into segments: the parts of one document inside one piece.

Every rank learns the others' piece lengths from the header (gdn_cp.distributed.header), which also makes
all of them agree on the call before anything depends on the split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch

Layout = Literal["contiguous", "zigzag"]
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag")
DEFAULT_LAYOUT: str = LAYOUTS[0]


def check_layout(layout: str) -> None:
    """ValueError listing the layouts for an unknown name."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown CP layout {layout!r}; use one of {', '.join(LAYOUTS)}")


def pieces_per_rank(layout: str) -> int:
    """How many global pieces one rank holds (1 contiguous, 2 zigzag)."""
    check_layout(layout)
    return 2 if layout == "zigzag" else 1


def piece_owners(layout: str, cp: int) -> tuple[int, ...]:
    """The rank holding each global piece, in global order."""
    if pieces_per_rank(layout) == 1:
        return tuple(range(cp))
    return (*range(cp), *range(cp - 1, -1, -1))


def split_pieces(layout: str, shard_len: int) -> tuple[int, ...]:
    """The lengths of one rank's pieces in a shard of `shard_len` tokens (zigzag: two halves)."""
    return (shard_len // 2, shard_len - shard_len // 2) if pieces_per_rank(layout) == 2 else (shard_len,)


def check_zigzag_split(seq_len: int, cp: int) -> None:
    """ValueError, with the fix, unless `seq_len` cuts into 2 cp equal pieces of >= 1 token."""
    if seq_len < 2 * cp or seq_len % (2 * cp):
        raise ValueError(
            f"layout='zigzag' cuts the sequence into 2 * cp = {2 * cp} equal pieces, but T = {seq_len} does "
            f"not divide by {2 * cp}: pad the sequence to a multiple of {2 * cp}, or use layout='contiguous'"
        )


def zigzag_order(seq_len: int, cp: int, device: torch.device | None = None) -> torch.Tensor:
    """[T] global token positions in zigzag rank order (rank 0's tokens, then rank 1's, ...)."""
    check_zigzag_split(seq_len, cp)
    piece = seq_len // (2 * cp)
    order = [j for r in range(cp) for j in (r, 2 * cp - 1 - r)]
    return (
        torch.tensor(order, device=device)[:, None] * piece + torch.arange(piece, device=device)
    ).flatten()


# -- documents on a rank ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """The part of one document inside one of this rank's pieces."""

    piece: int
    """Position of the piece among this rank's pieces (0, or 0/1 in zigzag)."""
    document: int
    """Global index of the document (0 without cu_seqlens)."""
    start: int
    """Offset in this rank's tokens (its pieces concatenated)."""
    length: int
    carried: bool
    """The document began before this piece: the segment enters with the state entering the piece."""
    ends_document: bool
    """The segment holds the document's last token: its final state is the document's."""


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """Every rank's pieces and their lengths: the same object on every rank but for `rank`."""

    layout: str
    rank: int
    cp: int
    lengths: tuple[int, ...]
    """Of every global piece, in global order."""

    @property
    def owners(self) -> tuple[int, ...]:
        return piece_owners(self.layout, self.cp)

    @property
    def total(self) -> int:
        """Global tokens T."""
        return sum(self.lengths)

    @property
    def starts(self) -> tuple[int, ...]:
        """Global offset of every piece."""
        out, at = [], 0
        for n in self.lengths:
            out.append(at)
            at += n
        return tuple(out)

    @property
    def local_pieces(self) -> tuple[int, ...]:
        """Global indices of this rank's pieces, in the order its tokens hold them (increasing)."""
        return tuple(j for j, owner in enumerate(self.owners) if owner == self.rank)

    @property
    def local_lengths(self) -> tuple[int, ...]:
        return tuple(self.lengths[j] for j in self.local_pieces)

    def shard_lengths(self) -> tuple[int, ...]:
        """Tokens held by every rank."""
        out = [0] * self.cp
        for j, owner in enumerate(self.owners):
            out[owner] += self.lengths[j]
        return tuple(out)

    def global_positions(self, device: torch.device | None = None) -> torch.Tensor:
        """[L] the global position of every token this rank holds."""
        starts = self.starts
        return torch.cat(
            [torch.arange(starts[j], starts[j] + self.lengths[j], device=device) for j in self.local_pieces]
        )

    def rank_order(self, device: torch.device | None = None) -> torch.Tensor | None:
        """[T] the global position of every token of the ranks' shards concatenated in rank order (what an
        all-to-all that gathers the sequence holds), or None when that is already the global order."""
        if self.layout == "contiguous":
            return None
        return torch.cat([replace(self, rank=r).global_positions(device) for r in range(self.cp)])

    def segments(self, bounds: Sequence[int] | None) -> list[LocalSegment]:
        """This rank's tokens cut at its pieces' edges and at the document boundaries `bounds` (global,
        [0, ..., T]; None: one document)."""
        bounds = list(bounds) if bounds is not None else [0, self.total]
        out: list[LocalSegment] = []
        offset = 0
        starts = self.starts
        for position, j in enumerate(self.local_pieces):
            lo, hi = starts[j], starts[j] + self.lengths[j]
            # Documents [bounds[d], bounds[d + 1]) that overlap [lo, hi).
            d = max(i for i in range(len(bounds) - 1) if bounds[i] <= lo)
            while d < len(bounds) - 1 and bounds[d] < hi:
                a, b = max(bounds[d], lo), min(bounds[d + 1], hi)
                out.append(
                    LocalSegment(
                        piece=position,
                        document=d,
                        start=offset + a - lo,
                        length=b - a,
                        carried=bounds[d] < lo,
                        ends_document=bounds[d + 1] <= hi,
                    )
                )
                d += 1
            offset += hi - lo
        return out
