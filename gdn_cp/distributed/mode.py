"""The base of every CP mode: the call boundary of a GatedDeltaNet under context parallelism.

A mode receives the layer and this rank's input shard and returns this rank's output shard. The base class
handles what all modes share: DTensor inputs (a Shard(1) placement; its local shard is used and the output
is wrapped back), and the check that every rank holds an equal shard, before any mode-specific exchange.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor, Shard

from gdn_cp.distributed.collectives import all_gather_stack, group_rank_size
from gdn_cp.distributed.sharding import check_cp_shapes

if TYPE_CHECKING:
    from gdn_cp.layers import GatedDeltaNet


class CPMode(ABC):
    """Runs a GatedDeltaNet on a sequence shard. Subclasses implement `forward_shard`."""

    name: str = ""

    def __init__(self, group: ProcessGroup | None, checkpoint_summary: bool) -> None:
        self.group = group
        self.rank, self.size = group_rank_size(group)
        self.checkpoint_summary = checkpoint_summary

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
        self._check_even_shards(hidden_states.shape[1], layer)
        out = self.forward_shard(layer, hidden_states)
        if placement is not None:
            out = DTensor.from_local(out, placement[0], placement[1], run_check=False)
        return out

    def _check_even_shards(self, local_len: int, layer: GatedDeltaNet) -> None:
        if self.size == 1:
            return
        lengths = all_gather_stack(torch.tensor([local_len]), self.group).flatten().tolist()
        if len(set(lengths)) != 1:
            raise ValueError(
                f"CP ranks hold shards of {lengths} tokens; the global sequence ({sum(lengths)} tokens) "
                f"must split evenly over cp={self.size}: pad it to a multiple of {self.size} and use "
                "shard_sequence"
            )
        check_cp_shapes(self.name, layer.config, self.size, sum(lengths))

    @abstractmethod
    def forward_shard(self, layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
        """x [B, L, hidden] this rank's shard -> [B, L, hidden]."""
