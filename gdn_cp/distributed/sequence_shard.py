"""The shared pipeline of the sequence-shard modes (p2p, all_gather): full heads, local tokens.

    project -> Conv1D with the left halo from earlier ranks -> prepare chunks -> local summary (S, M)
            -> H_in (the mode's exchange) -> outputs from the same prepared chunks -> norm, gate, out-proj

Every rank summarises its shard in parallel; only summaries or states cross ranks. The chunk preparation
(UT transform, W, U, masked QK^T) is done once and serves both the summary and the outputs.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from gdn_cp.distributed.collectives import exchange_halo
from gdn_cp.distributed.mode import CPMode
from gdn_cp.layers import GatedDeltaNet
from gdn_cp.ops import causal_conv1d, chunk_outputs, gdn_state_summary, prepare_chunks


class SequenceShardMode(CPMode):
    def forward_shard(self, layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
        c = layer.config
        p = layer.project(x)
        halo = exchange_halo(p.mixed_qkv, c.conv_kernel_size - 1, self.group)
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
