"""P2P CP: the recurrent state is handed rank to rank (design.md section 3).

After the local summaries are computed in parallel, rank r waits for H_in from rank r-1 and sends
M @ H_in + S on; one [B, Hv, K, V] state per hop each way (dH travels back in backward). Latency grows with
cp (cp - 1 sequential hops of a small message), volume does not.
"""

from __future__ import annotations

import torch

from gdn_cp.distributed.collectives import state_chain
from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.modes.base import CommCase
from gdn_cp.distributed.modes.sequence_shard import SequenceShardMode


class P2PMode(SequenceShardMode):
    name = "p2p"
    description = "conv halo, then the state passed rank to rank (cp - 1 hops)"
    color = "#ff7f0e"
    marker = "s"

    @classmethod
    def state_exchange(cls, volume: Volume, case: CommCase, state_bytes: int) -> None:
        """One state B Hv K V s from rank r-1 and one to rank r+1; the backward the other way."""
        c = case.config
        state = case.batch * c.num_v_heads * c.head_k_dim * c.head_v_dim * state_bytes
        first, last = case.rank == 0, case.rank == case.cp - 1
        hops = int(not first) + int(not last)
        add_volume(volume, "p2p", 0 if last else state, 0 if first else state, hops)
        if case.backward:
            add_volume(volume, "p2p", 0 if first else state, 0 if last else state, hops)

    def initial_state(self, S: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
        return state_chain(S, M, self.group)
