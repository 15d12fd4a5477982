"""Ulysses CP: Shard(sequence) -> Shard(head) for the recurrence, and back.

Projections run on the local sequence shard. Q/K/V (before the Conv1D), B and A are packed per destination
rank into one all-to-all, after which each rank holds the full sequence for Hk/cp key heads and Hv/cp value
heads; the depthwise Conv1D and the GDN run there with the local slices of the conv weight, A_log and
dt_bias. A reverse all-to-all returns the outputs to sequence shards for the norm, gate and out-projection.
Moves O(T/cp x channels) per rank, twice; needs Hk and Hv divisible by cp. Summary checkpointing does not
apply (there is no state summary).

Shard lengths: the all-to-all's message sizes follow from them, so they must be known before it. The mode
learns them with one all-gather of an int64 on its first call and again only when this rank's shard length
changes (every rank's changes with the global length), never in the steady state of a training loop.
"""

from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from gdn_cp.distributed.collectives import all_gather_stack, all_to_all
from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.modes.base import CommCase, CPMode
from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig
from gdn_cp.ops import causal_conv1d

LENGTH_CHECK_BYTES = 8
"""One int64 per rank: the all-gather that tells a ulysses layer every shard length (first call only)."""


class UlyssesMode(CPMode):
    name = "ulysses"
    description = "all-to-all to head shards and back; needs heads divisible by cp"
    has_summary = False
    color = "#1f77b4"
    marker = "o"

    def __init__(self, group: ProcessGroup | None, checkpoint_summary: bool) -> None:
        super().__init__(group, checkpoint_summary)
        self._checked_length: int | None = None

    @classmethod
    def check_shapes(cls, config: GatedDeltaNetConfig, cp_size: int) -> None:
        bad = [
            f"{name}={n}"
            for name, n in (("num_k_heads", config.num_k_heads), ("num_v_heads", config.num_v_heads))
            if n % cp_size
        ]
        if bad:
            raise ValueError(
                f"ulysses shards heads over cp={cp_size} ranks, but {' and '.join(bad)} "
                f"(num_k_heads={config.num_k_heads}, num_v_heads={config.num_v_heads}) is not divisible by "
                f"{cp_size}; choose a cp that divides both, or mode p2p / all_gather"
            )

    @classmethod
    def communication(cls, case: CommCase) -> Volume:
        """Per all-to-all, each way (forward: 2, backward: 2 more), with L = T / cp and e the dtype's bytes:
        Q/K/V/B/A out B L (cp - 1) (2 Hk K + Hv V + 2 Hv) / cp e; outputs back B L (cp - 1) Hv V / cp e.
        On a layer's first call, the length check: 8 (cp - 1) bytes each way (all_gather)."""
        config, cp, batch = case.config, case.cp, case.batch
        e = torch.empty((), dtype=config.dtype).element_size()
        L, passes = case.seq_len // cp, 2 if case.backward else 1
        Hk, Hv, K, V = config.num_k_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim
        packed = batch * L * (cp - 1) * (2 * Hk * K + Hv * V + 2 * Hv) // cp * e
        outputs = batch * L * (cp - 1) * Hv * V // cp * e
        volume: Volume = {}
        if case.first_call:
            moved = LENGTH_CHECK_BYTES * (cp - 1)
            add_volume(volume, "all_gather", moved, moved)
        add_volume(volume, "all_to_all", passes * (packed + outputs), passes * (packed + outputs), 2 * passes)
        return volume

    def _check_lengths(self, local_len: int, device: torch.device) -> None:
        if self.size == 1 or local_len == self._checked_length:
            return
        lengths = all_gather_stack(torch.tensor([local_len], device=device), self.group).flatten().tolist()
        self.check_even_shards(lengths)
        self._checked_length = local_len

    def forward_shard(self, layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
        c, cp, r = layer.config, self.size, self.rank
        B, L, _ = x.shape
        self._check_lengths(L, x.device)
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
