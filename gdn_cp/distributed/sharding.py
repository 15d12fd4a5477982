"""Sequence sharding for CP: this rank's part of a global sequence, in a layout, and the whole back."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup

from gdn_cp.distributed.collectives import exchange_header, group_rank_size
from gdn_cp.distributed.layout import DEFAULT_LAYOUT, check_layout, check_zigzag_split, zigzag_order
from gdn_cp.distributed.transfers import all_gather_stack


def check_sequence_split(seq_len: int, cp_size: int) -> None:
    """ValueError, with the fix, unless `seq_len` tokens split into `cp_size` equal shards."""
    if seq_len < cp_size or seq_len % cp_size:
        raise ValueError(
            f"a global sequence of {seq_len} tokens does not split evenly over cp={cp_size} ranks; "
            f"use a multiple of {cp_size} (pad the sequence)"
        )


def check_layout_split(seq_len: int, cp_size: int, layout: str = DEFAULT_LAYOUT) -> None:
    """ValueError, with the fix, unless `shard_sequence` can cut `seq_len` tokens evenly in `layout`."""
    check_layout(layout)
    if layout == "zigzag":
        check_zigzag_split(seq_len, cp_size)
    else:
        check_sequence_split(seq_len, cp_size)


def shard_sequence(
    x: torch.Tensor,
    group: ProcessGroup | None = None,
    dim: int = 1,
    layout: str = DEFAULT_LAYOUT,
    lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """This rank's part of the global sequence along `dim`.

    Args:
        x: the global tensor, e.g. [B, T, hidden], identical on every rank
        layout: "contiguous" (equal slices, or `lengths`) or "zigzag" (chunks r and 2 cp - 1 - r of 2 cp)
        lengths: contiguous only: every rank's shard length (sum T), for an uneven split
    Returns:
        [B, T/cp, hidden] (a view for contiguous shards)
    """
    rank, size = group_rank_size(group)
    T = x.shape[dim]
    if lengths is not None:
        if layout != "contiguous":
            raise ValueError(f"shard_sequence: lengths= applies to layout='contiguous', not {layout!r}")
        if len(lengths) != size or sum(lengths) != T or min(lengths) < 1:
            raise ValueError(
                f"shard_sequence: lengths={list(lengths)} must hold one length >= 1 per rank ({size}) "
                f"summing to T = {T}"
            )
        return x.split(list(lengths), dim=dim)[rank]
    check_layout_split(T, size, layout)
    if layout == "zigzag":
        pieces = x.chunk(2 * size, dim=dim)
        return torch.cat([pieces[rank], pieces[2 * size - 1 - rank]], dim=dim)
    return x.chunk(size, dim=dim)[rank]


def gather_sequence(
    x: torch.Tensor, group: ProcessGroup | None = None, dim: int = 1, layout: str = DEFAULT_LAYOUT
) -> torch.Tensor:
    """The global sequence from every rank's part, along `dim` (any lengths in the contiguous layout).
    Differentiable. For tests and evaluation: one header all-gather, then one all-gather of padded shards."""
    _, size = group_rank_size(group)
    check_layout(layout)
    lengths = [h[0] for h in exchange_header([x.shape[dim]], group, x.device)]
    longest = max(lengths)
    moved = x.movedim(dim, 0)
    padded = F.pad(moved, (0, 0) * (moved.dim() - 1) + (0, longest - moved.shape[0]))
    stacked = all_gather_stack(padded, group)  # [cp, longest, ...]
    full = torch.cat([stacked[r, : lengths[r]] for r in range(size)])
    if layout == "zigzag":
        full = full.index_select(0, torch.argsort(zigzag_order(full.shape[0], size, full.device)))
    return full.movedim(0, dim)
