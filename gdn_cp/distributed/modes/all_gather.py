"""All-gather CP: every rank gathers all summaries and folds those of the ranks before it.

Summaries are packed as [S | M] ([B, Hv, K, V + K]), one per piece, into one differentiable all-gather; the
holder of piece j then folds pieces 0..j-1 locally into its H_in. One collective and no sequential hops, at
the cost of moving every piece's summary (K x (V + K) each) instead of one state.
"""

from __future__ import annotations

import torch

from gdn_cp.distributed import mutants
from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.layout import ShardPlan, pieces_per_rank
from gdn_cp.distributed.modes.base import CommCase
from gdn_cp.distributed.modes.sequence_shard import SequenceShardMode
from gdn_cp.distributed.transfers import InFlight, begin_all_gather_stack
from gdn_cp.ops import fold_summaries, pack_summary, unpack_summary


class AllGatherMode(SequenceShardMode):
    name = "all_gather"
    description = "conv halo, then every rank's [S | M] summary gathered and folded locally"

    @classmethod
    def held_summaries(cls, cp_size: int) -> int:
        return cp_size

    @classmethod
    def state_exchange(cls, volume: Volume, case: CommCase, state_bytes: int) -> None:
        """One all-gather of the packed [S | M] of every piece (P per rank): (cp - 1) P B Hv K (V + K) s each
        way; the backward moves the same volume back, to sum each slot at its owner."""
        c = case.config
        packed = (case.cp - 1) * case.batch * c.num_v_heads * c.head_k_dim * (c.head_v_dim + c.head_k_dim)
        packed *= state_bytes * pieces_per_rank(case.layout)
        passes = 2 if case.backward else 1
        add_volume(volume, "all_gather", passes * packed, passes * packed, passes)

    @classmethod
    def exchange_flops(cls, case: CommCase) -> int:
        """Each of this rank's P pieces folds all cp P gathered slots (later ones as the identity): one
        M @ H + S per slot, 2 K^2 V per value head; the backward twice that."""
        c = case.config
        slots = case.cp * pieces_per_rank(case.layout) ** 2
        per_slot = 2 * case.batch * c.num_v_heads * c.head_k_dim**2 * c.head_v_dim
        return slots * per_slot * (3 if case.backward else 1)

    def begin_entering_states(self, S: torch.Tensor, M: torch.Tensor, plan: ShardPlan) -> InFlight:
        gathering = begin_all_gather_stack(pack_summary(S, M), self.group)  # [cp, P, B, Hv, K, V + K]
        gathering.then(lambda gathered: self._fold(gathered, S, M, plan))
        if mutants.ACTIVE is not None:  # a test's mutation of what arrived (gdn_cp.distributed.mutants)
            gathering.then(lambda h_in: mutants.entering_states(h_in, self.rank))
        return gathering

    def _fold(
        self, gathered: torch.Tensor, S: torch.Tensor, M: torch.Tensor, plan: ShardPlan
    ) -> torch.Tensor:
        """H_in [P, B, Hv, K, V] of this rank's pieces from the gathered [cp, P, B, Hv, K, V + K]."""
        # Global order: piece j is slot (owner, its position among the owner's pieces).
        per_rank = gathered.shape[1]
        seen = [0] * self.size
        slots = []
        for owner in plan.owners:
            slots.append(owner * per_rank + seen[owner])
            seen[owner] += 1
        ordered = gathered.flatten(0, 1).index_select(0, torch.tensor(slots, device=S.device))
        if mutants.ACTIVE is not None:
            ordered = mutants.ordered_summaries(ordered, plan.local_pieces[0], self.rank)
        S_all, M_all = unpack_summary(ordered, S.shape[-1])
        eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
        states = []
        for j in plan.local_pieces:
            # Fold every slot, those of piece j and later replaced by the identity map (S = 0, M = I): the
            # result is the fold of pieces 0..j-1, and it depends on the gather on every rank (piece 0 too),
            # so the gather's backward (a collective) runs everywhere.
            before = (torch.arange(len(slots), device=S.device) < j).view(-1, 1, 1, 1, 1)
            S_j = torch.where(before, S_all, torch.zeros_like(S_all))
            M_j = torch.where(before, M_all, eye)
            states.append(fold_summaries(list(zip(S_j.unbind(0), M_j.unbind(0), strict=True))))
        return torch.stack(states)
