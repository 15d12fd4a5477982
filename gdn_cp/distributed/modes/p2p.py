"""P2P CP: the recurrent state is handed rank to rank (design.md section 3).

After the local summaries are computed in parallel, the state walks the pieces in global order: the holder
of piece j waits for H_in from the holder of piece j-1 and sends M @ H_in + S on; one [B, Hv, K, V] state per
hop each way (dH travels back in backward). Latency grows with cp (cp - 1 sequential hops of a small
message for contiguous shards, 2 (cp - 1) for zigzag), volume does not.
"""

from __future__ import annotations

import torch

from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.layout import ShardPlan, piece_owners
from gdn_cp.distributed.modes.base import CommCase
from gdn_cp.distributed.modes.sequence_shard import SequenceShardMode, state_bytes
from gdn_cp.distributed.transfers import InFlight, begin_state_chain


class P2PMode(SequenceShardMode):
    name = "p2p"
    description = "conv halo, then the state passed rank to rank (cp - 1 hops)"

    @classmethod
    def state_exchange(cls, volume: Volume, case: CommCase, state_bytes: int) -> None:
        """One state B Hv K V s per hop between pieces held by different ranks: received for each piece here
        whose predecessor is elsewhere, sent for each whose successor is; the backward the other way."""
        c = case.config
        state = case.batch * c.num_v_heads * c.head_k_dim * c.head_v_dim * state_bytes
        owners = piece_owners(case.layout, case.cp)
        mine = [j for j, o in enumerate(owners) if o == case.rank]
        recvs = sum(j > 0 and owners[j - 1] != case.rank for j in mine)
        sends = sum(j + 1 < len(owners) and owners[j + 1] != case.rank for j in mine)
        add_volume(volume, "p2p", sends * state, recvs * state, sends + recvs)
        if case.backward:
            add_volume(volume, "p2p", recvs * state, sends * state, sends + recvs)

    @classmethod
    def critical_path(cls, case: CommCase) -> dict[str, tuple[int, float]]:
        """The state relayed piece to piece: the last piece waits for P - 1 hops (P pieces in all), and the
        first for as many in backward, one state each; the halo as every rank's."""
        path = super().critical_path(case)
        c = case.config
        state = case.batch * c.num_v_heads * c.head_k_dim * c.head_v_dim * state_bytes(c)
        hops = (len(piece_owners(case.layout, case.cp)) - 1) * (2 if case.backward else 1)
        path["p2p"] = (hops, state)
        return path

    def begin_entering_states(self, S: torch.Tensor, M: torch.Tensor, plan: ShardPlan) -> InFlight:
        # Posted early: piece 0's state (its summary's S) and every rank's first receive; the rest of the
        # chain runs at the wait.
        return begin_state_chain(S, M, self.group, plan.owners)
