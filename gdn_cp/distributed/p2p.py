"""P2P CP: the recurrent state is handed rank to rank (design.md section 3).

After the local summaries are computed in parallel, rank r waits for H_in from rank r-1 and sends
M @ H_in + S on; one [B, Hv, K, V] state per hop each way (dH travels back in backward). Latency grows with
cp (cp - 1 sequential hops of a small message), volume does not.
"""

from __future__ import annotations

import torch

from gdn_cp.distributed.collectives import state_chain
from gdn_cp.distributed.sequence_shard import SequenceShardMode


class P2PMode(SequenceShardMode):
    name = "p2p"

    def initial_state(self, S: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
        return state_chain(S, M, self.group)
