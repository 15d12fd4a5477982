"""All-gather CP: every rank gathers all summaries and folds those of the ranks before it.

Summaries are packed as [S | M] ([B, Hv, K, V + K]) into one differentiable all-gather; rank r then folds
ranks 0..r-1 locally into its H_in. One collective and no sequential hops, at the cost of moving cp
summaries (K x (V + K) each) instead of one state.
"""

from __future__ import annotations

import torch

from gdn_cp.distributed.collectives import all_gather_stack
from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.modes.base import CommCase
from gdn_cp.distributed.modes.sequence_shard import SequenceShardMode
from gdn_cp.ops import fold_summaries, pack_summary, unpack_summary


class AllGatherMode(SequenceShardMode):
    name = "all_gather"
    description = "conv halo, then every rank's [S | M] summary gathered and folded locally"
    color = "#2ca02c"
    marker = "^"

    @classmethod
    def held_summaries(cls, cp_size: int) -> int:
        return cp_size

    @classmethod
    def state_exchange(cls, volume: Volume, case: CommCase, state_bytes: int) -> None:
        """One all-gather of the packed [S | M]: (cp - 1) B Hv K (V + K) s each way; the backward moves the
        same volume back, to sum each slot at its owner."""
        c = case.config
        packed = (case.cp - 1) * case.batch * c.num_v_heads * c.head_k_dim * (c.head_v_dim + c.head_k_dim)
        packed *= state_bytes
        passes = 2 if case.backward else 1
        add_volume(volume, "all_gather", passes * packed, passes * packed, passes)

    def initial_state(self, S: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
        gathered = all_gather_stack(pack_summary(S, M), self.group)  # [cp, B, Hv, K, V + K]
        S_all, M_all = unpack_summary(gathered, S.shape[-1])
        # Fold every slot, those of this rank and later ones replaced by the identity map (S = 0, M = I):
        # the result is the fold of ranks 0..r-1, and every rank's output depends on the gather, so its
        # backward (a collective) runs on every rank, rank 0 included.
        before = (torch.arange(self.size, device=S.device) < self.rank).view(-1, 1, 1, 1, 1)
        eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
        S_all = torch.where(before, S_all, torch.zeros_like(S_all))
        M_all = torch.where(before, M_all, eye)
        return fold_summaries(list(zip(S_all.unbind(0), M_all.unbind(0), strict=True)))
