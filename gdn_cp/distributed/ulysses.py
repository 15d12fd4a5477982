"""Ulysses CP: Shard(sequence) -> Shard(head) for the recurrence, and back.

Projections run on the local sequence shard. Q/K/V (before the Conv1D), B and A are packed per destination
rank into one all-to-all, after which each rank holds the full sequence for Hk/cp key heads and Hv/cp value
heads; the depthwise Conv1D and the GDN run there with the local slices of the conv weight, A_log and
dt_bias. A reverse all-to-all returns the outputs to sequence shards for the norm, gate and out-projection.
Moves O(T/cp x channels) per rank, twice; needs Hk and Hv divisible by cp. Summary checkpointing does not
apply (there is no state summary).
"""

from __future__ import annotations

import torch

from gdn_cp.distributed.collectives import all_to_all
from gdn_cp.distributed.mode import CPMode
from gdn_cp.layers import GatedDeltaNet
from gdn_cp.ops import causal_conv1d


class UlyssesMode(CPMode):
    name = "ulysses"

    def forward_shard(self, layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
        c, cp, r = layer.config, self.size, self.rank
        B, L, _ = x.shape
        hk, hv = c.num_k_heads // cp, c.num_v_heads // cp
        kd, vd = hk * c.head_k_dim, hv * c.head_v_dim  # local q/k and v channels
        p = layer.project(x)
        q, k, v = p.mixed_qkv.split([c.key_dim, c.key_dim, c.value_dim], dim=-1)
        # [B, L, cp, channels of destination rank's heads]: heads are contiguous per rank in every tensor.
        packed = torch.cat(
            [
                q.view(B, L, cp, kd),
                k.view(B, L, cp, kd),
                v.view(B, L, cp, vd),
                p.b.view(B, L, cp, hv),
                p.a.view(B, L, cp, hv),
            ],
            dim=-1,
        )
        full = all_to_all(packed, scatter_dim=2, gather_dim=1, group=self.group).squeeze(2)  # [B, T, ch]
        mixed, b, a = full.split([2 * kd + vd, hv, hv], dim=-1)

        w = layer.conv1d.weight
        w_local = torch.cat(
            [
                w[r * kd : (r + 1) * kd],
                w[c.key_dim + r * kd : c.key_dim + (r + 1) * kd],
                w[2 * c.key_dim + r * vd : 2 * c.key_dim + (r + 1) * vd],
            ]
        )
        ql, kl, vl = layer.split_qkv(causal_conv1d(mixed, w_local))
        o = layer.core(ql, kl, vl, a, b, heads=slice(r * hv, (r + 1) * hv))  # [B, T, hv, V]
        o = all_to_all(o, scatter_dim=1, gather_dim=2, group=self.group)  # [B, L, Hv, V]
        return layer.output(o, p.z)
