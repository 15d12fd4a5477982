"""Scan CP: the pieces' affine summaries combined by a parallel prefix over the pieces, in ceil(log2 P)
rounds of point-to-point messages (P pieces: cp contiguous, 2 cp zigzag), instead of p2p's P - 1 sequential
hops or all_gather's P summaries held by every rank.

The prefix is Hillis-Steele (Kogge-Stone), chosen over Blelloch because it takes log2 P rounds where
Blelloch's up- and down-sweep take 2 log2 P, and latency (rounds), not volume, is what a scan of small
messages pays; its extra work (P log P compositions in all, log P per rank) is a few K x K products per round.
Each piece v keeps its exclusive window E_v as a map (the composition of the pieces in (v - 2^k, v)) and, in
round k (d = 2^k), sends its inclusive window I_v = x_v after E_v to piece v + d and receives I_{v-d}, which
covers (v - 2d, v - d]; then E_v <- E_v after I_{v-d} covers (v - 2d, v). After ceil(log2 P) rounds E_v covers
every earlier piece, and H_in(v) = E_v applied to the zero state: no final shift is needed. A rank holds two
summaries of other pieces at a time (E_v and the one received), whatever cp. The backward is the reverse
scan autograd derives from the rounds (each round's shift, backwards, is the same exchange the other way).
"""

from __future__ import annotations

import math

import torch

from gdn_cp.distributed import mutants
from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.layout import ShardPlan, piece_owners, pieces_per_rank
from gdn_cp.distributed.modes.base import CommCase
from gdn_cp.distributed.modes.sequence_shard import SequenceShardMode, state_bytes
from gdn_cp.distributed.transfers import InFlight, begin_shift_pieces, shift_pieces
from gdn_cp.ops import pack_summary, unpack_summary


def scan_rounds(pieces: int) -> int:
    """Rounds of the parallel prefix over `pieces` pieces: ceil(log2 pieces)."""
    return math.ceil(math.log2(pieces)) if pieces > 1 else 0


class ScanMode(SequenceShardMode):
    name = "scan"
    description = "conv halo, then a log-depth parallel prefix of the summaries (ceil(log2 cp) rounds)"

    @classmethod
    def held_summaries(cls, cp_size: int) -> int:
        return 2 if cp_size > 1 else 0

    @classmethod
    def state_exchange(cls, volume: Volume, case: CommCase, state_bytes: int) -> None:
        """In round k (d = 2^k), piece v sends one packed [S | M], B Hv K (V + K) s bytes, to piece v + d and
        receives one from piece v - d, where those exist and are held by another rank; the backward moves
        the same messages the other way."""
        c = case.config
        packed = case.batch * c.num_v_heads * c.head_k_dim * (c.head_v_dim + c.head_k_dim) * state_bytes
        owners = piece_owners(case.layout, case.cp)
        mine = [j for j, o in enumerate(owners) if o == case.rank]
        sends = recvs = 0
        for k in range(scan_rounds(len(owners))):
            d = 2**k
            sends += sum(j + d < len(owners) and owners[j + d] != case.rank for j in mine)
            recvs += sum(j - d >= 0 and owners[j - d] != case.rank for j in mine)
        add_volume(volume, "p2p", sends * packed, recvs * packed, sends + recvs)
        if case.backward:
            add_volume(volume, "p2p", recvs * packed, sends * packed, sends + recvs)

    @classmethod
    def critical_path(cls, case: CommCase) -> dict[str, tuple[int, float]]:
        """One packed summary per round, ceil(log2 P) rounds each way; the halo as every rank's."""
        path = super().critical_path(case)
        c = case.config
        packed = case.batch * c.num_v_heads * c.head_k_dim * (c.head_v_dim + c.head_k_dim) * state_bytes(c)
        rounds = scan_rounds(len(piece_owners(case.layout, case.cp))) * (2 if case.backward else 1)
        path["p2p"] = (rounds, packed)
        return path

    @classmethod
    def exchange_flops(cls, case: CommCase) -> int:
        """Per round and piece: I_v (M E_S, M E_M) and E_v <- E_v after I_{v-d} (two products more),
        4 K^2 (V + K) per value head; the backward twice that."""
        c = case.config
        rounds = scan_rounds(len(piece_owners(case.layout, case.cp)))
        per = 4 * case.batch * c.num_v_heads * c.head_k_dim**2 * (c.head_v_dim + c.head_k_dim)
        return rounds * pieces_per_rank(case.layout) * per * (3 if case.backward else 1)

    def begin_entering_states(self, S: torch.Tensor, M: torch.Tensor, plan: ShardPlan) -> InFlight:
        # Round 0 is posted now (I_v = x_v: the exclusive window is still empty); the later rounds need the
        # earlier ones and run at the wait.
        rounds = scan_rounds(len(plan.owners))
        if rounds == 0:
            return InFlight.done(torch.zeros_like(S))
        first = begin_shift_pieces(pack_summary(S, M), 1, self.group, plan.owners)
        first.then(lambda got: self._rounds(got, S, M, plan, rounds))
        if mutants.ACTIVE is not None:  # a test's mutation of what arrived (gdn_cp.distributed.mutants)
            first.then(lambda h_in: mutants.entering_states(h_in, self.rank))
        return first

    def _rounds(
        self, got: torch.Tensor, S: torch.Tensor, M: torch.Tensor, plan: ShardPlan, rounds: int
    ) -> torch.Tensor:
        """E_v applied to the zero state, [P, B, Hv, K, V], from round 0's received I_{v-1}."""
        owners = plan.owners
        eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device).expand_as(M)
        excl_S, excl_M = torch.zeros_like(S), eye  # E_v: the empty window
        mine = torch.tensor(plan.local_pieces, device=S.device).view(-1, *(1,) * (S.dim() - 1))
        if mutants.ACTIVE is not None:
            got = mutants.received_summaries(got, pack_summary(S, M), self.rank)
        for k in range(rounds):
            d = 2**k
            if k > 0:
                inclusive = pack_summary(M @ excl_S + S, M @ excl_M)  # I_v = x_v after E_v
                got = shift_pieces(inclusive, d, self.group, owners)
            got_S, got_M = unpack_summary(got, S.shape[-1])
            # Where piece v - d exists, E_v <- E_v after I_{v-d}; `where` keeps every rank's result on the
            # received tensor, so that each round's backward exchange runs on every rank.
            has = mine >= d
            excl_S = torch.where(has, excl_M @ got_S + excl_S, excl_S)
            excl_M = torch.where(has, excl_M @ got_M, excl_M)
        return excl_S  # E_v applied to the zero state
