"""The base of every CP mode: the call boundary of a GatedDeltaNet under context parallelism, and the facts
a mode declares about itself (read through the registry, gdn_cp.distributed.modes).

A mode receives the layer and this rank's input shard and returns this rank's output shard. The base class
handles what all modes share: DTensor inputs (a Shard(1) placement; its local shard is used and the output
is wrapped back) and the clear error for shards of different lengths. The lengths are never checked by a
collective of their own: each mode learns them from the first exchange it makes anyway (`shard_lengths`)
and calls `check_even_shards` before anything depends on them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor, Shard

from gdn_cp.distributed.collectives import group_rank_size
from gdn_cp.distributed.comm_stats import Volume
from gdn_cp.distributed.sharding import check_sequence_split
from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig


@dataclass(frozen=True, slots=True)
class CommCase:
    """What one rank's communication in one pass depends on (the communication model's input)."""

    config: GatedDeltaNetConfig
    cp: int
    """Ranks; > 1."""
    rank: int
    """This rank, 0 .. cp - 1."""
    seq_len: int
    """Global tokens (each rank holds seq_len / cp)."""
    batch: int
    backward: bool
    """Forward and backward (else the forward alone)."""
    first_call: bool
    """The layer's first call, or the first after its shard length changed."""


class CPMode(ABC):
    """Runs a GatedDeltaNet on a sequence shard. Subclasses set the class facts and implement
    `forward_shard` and `communication`."""

    name: ClassVar[str]
    """The mode's name in configs, results and the CLI."""
    description: ClassVar[str]
    """One line: what crosses ranks."""
    has_summary: ClassVar[bool]
    """Whether the mode computes the affine (S, M) summary, so that checkpoint_summary applies."""
    color: ClassVar[str]
    """Its colour in charts (matplotlib colour)."""
    marker: ClassVar[str]
    """Its marker in charts (matplotlib marker)."""

    def __init__(self, group: ProcessGroup | None, checkpoint_summary: bool) -> None:
        self.group = group
        self.rank, self.size = group_rank_size(group)
        self.checkpoint_summary = checkpoint_summary

    # -- facts, for validation, estimates and the communication model -------------------------------------

    @classmethod
    def check_shapes(cls, config: GatedDeltaNetConfig, cp_size: int) -> None:
        """Raise ValueError, with the fix, if this mode cannot split `config` over `cp_size` ranks (the
        base: every split works)."""
        return

    @classmethod
    def held_summaries(cls, cp_size: int) -> int:
        """Packed [S | M] summaries of other ranks this rank holds at once (memory estimates)."""
        return 0

    @classmethod
    @abstractmethod
    def communication(cls, case: CommCase) -> Volume:
        """Bytes the case's rank sends and receives in one pass at cp > 1 (gdn_cp.distributed.comm_model
        documents the notation)."""

    # -- the call -------------------------------------------------------------------------------------------

    def __call__(self, layer: GatedDeltaNet, hidden_states: torch.Tensor) -> torch.Tensor:
        placement = None
        if isinstance(hidden_states, DTensor):
            placement = (hidden_states.device_mesh, hidden_states.placements)
            if not any(isinstance(p, Shard) and p.dim == 1 for p in hidden_states.placements):
                raise ValueError(
                    f"a DTensor input to a CP layer must be sharded on the sequence dim (Shard(1)); got "
                    f"{hidden_states.placements}"
                )
            hidden_states = hidden_states.to_local()
        out = self.forward_shard(layer, hidden_states)
        if placement is not None:
            out = DTensor.from_local(out, placement[0], placement[1], run_check=False)
        return out

    def check_even_shards(self, lengths: list[int]) -> None:
        """Refuse shards of different lengths (every rank sees the same `lengths`, so every rank raises)."""
        if len(set(lengths)) != 1:
            raise ValueError(
                f"CP ranks hold shards of {lengths} tokens; the global sequence ({sum(lengths)} tokens) "
                f"must split evenly over cp={self.size}: pad it to a multiple of {self.size} and use "
                "shard_sequence"
            )
        check_sequence_split(sum(lengths), self.size)

    @abstractmethod
    def forward_shard(self, layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
        """x [B, L, hidden] this rank's shard -> [B, L, hidden]."""
