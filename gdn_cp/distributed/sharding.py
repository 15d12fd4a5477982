"""Sequence sharding for CP: this rank's slice of a global sequence, and the global sequence back."""

from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from gdn_cp.distributed.collectives import all_gather_stack, group_rank_size


def check_sequence_split(seq_len: int, cp_size: int) -> None:
    """ValueError, with the fix, unless `seq_len` tokens split into `cp_size` equal shards."""
    if seq_len < cp_size or seq_len % cp_size:
        raise ValueError(
            f"a global sequence of {seq_len} tokens does not split evenly over cp={cp_size} ranks; "
            f"use a multiple of {cp_size} (pad the sequence)"
        )


def shard_sequence(x: torch.Tensor, group: ProcessGroup | None = None, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous slice of the global sequence along `dim` (a view).

    Args:
        x: the global tensor, e.g. [B, T, hidden], identical on every rank
    Returns:
        [B, T/cp, hidden]
    """
    rank, size = group_rank_size(group)
    check_sequence_split(x.shape[dim], size)
    return x.chunk(size, dim=dim)[rank]


def gather_sequence(x: torch.Tensor, group: ProcessGroup | None = None, dim: int = 1) -> torch.Tensor:
    """The global sequence from every rank's shard (equal shards), along `dim`. Differentiable."""
    stacked = all_gather_stack(x, group)  # [cp, ...]
    return torch.cat(stacked.unbind(0), dim=dim)
