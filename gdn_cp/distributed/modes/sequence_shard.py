"""The shared pipeline of the sequence-shard modes (p2p, all_gather): full heads, local tokens.

    project -> Conv1D with the left halo from earlier ranks -> prepare chunks -> local summary (S, M)
            -> H_in (the mode's exchange) -> outputs from the same prepared chunks -> norm, gate, out-proj

Every rank summarises its shard in parallel; only summaries or states cross ranks. The chunk preparation
(UT transform, W, U, masked QK^T) is done once and serves both the summary and the outputs. The halo
exchange also carries every rank's shard length, so the even-shard check costs no collective of its own.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from gdn_cp.distributed.collectives import HEADER_DIGITS, exchange_halo_with_lengths
from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.modes.base import CommCase, CPMode
from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.layers import GatedDeltaNet
from gdn_cp.ops import causal_conv1d, chunk_outputs, gdn_state_summary, prepare_chunks


class SequenceShardMode(CPMode):
    has_summary = True

    @classmethod
    def communication(cls, case: CommCase) -> Volume:
        """The halo exchange (w = conv_kernel_size - 1, D = 2 Hk K + Hv V, e the dtype's bytes): a length
        header of HEADER_DIGITS elements to and from every other rank, and B w D elements of tail to each of
        the next min(w, cp - 1 - r) ranks (received from min(w, r) earlier ones); the backward sends the
        same volume back. Then the mode's own exchange (`state_exchange`)."""
        config, cp, rank = case.config, case.cp, case.rank
        e = torch.empty((), dtype=config.dtype).element_size()
        width = config.conv_kernel_size - 1
        tail = case.batch * width * config.conv_dim * e
        header = HEADER_DIGITS * e * (cp - 1)
        sent = header + tail * min(width, cp - 1 - rank)
        received = header + tail * min(width, rank)
        volume: Volume = {}
        add_volume(volume, "halo", sent, received)
        if case.backward:
            add_volume(volume, "halo", received, sent)
        cls.state_exchange(
            volume, case, torch.empty((), dtype=accumulation_dtype(config.dtype)).element_size()
        )
        return volume

    @classmethod
    @abstractmethod
    def state_exchange(cls, volume: Volume, case: CommCase, state_bytes: int) -> None:
        """Add to `volume` what `initial_state` moves (states in the accumulation dtype: `state_bytes`)."""

    def forward_shard(self, layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
        c = layer.config
        p = layer.project(x)
        halo, lengths = exchange_halo_with_lengths(p.mixed_qkv, c.conv_kernel_size - 1, self.group)
        self.check_even_shards(lengths)
        q, k, v = layer.split_qkv(causal_conv1d(p.mixed_qkv, layer.conv1d.weight, halo))
        g, beta = layer.gates(p.a, p.b)
        chunks = prepare_chunks(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, chunk_size=c.chunk_size)
        S, M = gdn_state_summary(chunks, checkpoint_summary=self.checkpoint_summary)
        o, _ = chunk_outputs(chunks, self.initial_state(S, M))
        return layer.output(o, p.z)

    @abstractmethod
    def initial_state(self, S: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
        """The state entering this rank's shard, from every rank's summary.

        S [B, Hv, K, V] and M [B, Hv, K, K] are this rank's; returns H_in [B, Hv, K, V].
        """
