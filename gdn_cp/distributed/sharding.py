"""Sequence sharding for CP, and the shape rules every mode and the bench validator share."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.distributed import ProcessGroup

from gdn_cp.distributed.collectives import all_gather_stack, group_rank_size

if TYPE_CHECKING:
    from gdn_cp.layers import GatedDeltaNetConfig

MODES: tuple[str, ...] = ("ulysses", "p2p", "all_gather")
"""The CP modes of LinearAttentionContextParallel; ulysses is the default."""


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown CP mode {mode!r}; use one of {', '.join(MODES)}")


def check_cp_shapes(mode: str, config: GatedDeltaNetConfig, cp_size: int, seq_len: int | None = None) -> None:
    """Raise ValueError, with the fix, if `mode` cannot run `config` on `cp_size` ranks at `seq_len` tokens.

    Rules: the mode exists; cp_size >= 1; ulysses needs num_k_heads and num_v_heads divisible by cp_size
    (each rank takes whole heads); the global sequence must split evenly over the ranks.
    """
    check_mode(mode)
    if not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"cp size must be a positive integer, got {cp_size!r}")
    if mode == "ulysses":
        bad = [
            f"{name}={n}"
            for name, n in (("num_k_heads", config.num_k_heads), ("num_v_heads", config.num_v_heads))
            if n % cp_size
        ]
        if bad:
            raise ValueError(
                f"ulysses shards heads over cp={cp_size} ranks, but {' and '.join(bad)} "
                f"(num_k_heads={config.num_k_heads}, num_v_heads={config.num_v_heads}) is not divisible by "
                f"{cp_size}; choose a cp that divides both, or mode p2p / all_gather"
            )
    if seq_len is not None:
        check_sequence_split(seq_len, cp_size)


def check_sequence_split(seq_len: int, cp_size: int) -> None:
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
