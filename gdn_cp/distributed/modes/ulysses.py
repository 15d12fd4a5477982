"""Ulysses CP: Shard(sequence) -> Shard(head) for the recurrence, and back.

Projections run on the local sequence shard. Q/K/V (before the Conv1D), B and A are packed per destination
rank into one all-to-all, after which each rank holds the full sequence for Hk/cp key heads and Hv/cp value
heads; the depthwise Conv1D and the GDN run there with the local slices of the conv weight, A_log and
dt_bias. A reverse all-to-all returns the outputs to sequence shards for the norm, gate and out-projection.
Moves O(T/cp x channels) per rank, twice; needs Hk and Hv divisible by cp. Summary checkpointing does not
apply (there is no state summary).

Layouts and documents: the gathered sequence arrives in rank order, which a zigzag layout permutes; it is put
in global order before the Conv1D and the GDN (which then see packed documents exactly as on one device) and
back after, locally, with no extra exchange.

Shard lengths: the all-to-all's message sizes follow from them, so they must be known before it. The mode
learns them, with the input checks, from one all-gather of a few int64 per call (gdn_cp.distributed.layout):
shards may then differ in length from call to call and from rank to rank.
"""

from __future__ import annotations

import math

import torch

from gdn_cp.distributed import mutants
from gdn_cp.distributed.collectives import all_to_all
from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.layout import ShardPlan
from gdn_cp.distributed.modes.base import CommCase, CPMode
from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig
from gdn_cp.ops import causal_conv1d, conv_state, ran
from gdn_cp.ops.backends import Backend


class UlyssesMode(CPMode):
    name = "ulysses"
    description = "all-to-all to head shards and back; needs heads divisible by cp"
    has_summary = False

    @classmethod
    def check_shapes(cls, config: GatedDeltaNetConfig, cp_size: int) -> None:
        heads = (("num_k_heads", config.num_k_heads), ("num_v_heads", config.num_v_heads))
        bad = [f"{name}={n}" for name, n in heads if n % cp_size]
        if bad:
            other = [f" ({name}={n} is)" for name, n in heads if not n % cp_size]
            common = math.gcd(config.num_k_heads, config.num_v_heads)
            fits = ", ".join(str(d) for d in range(1, common + 1) if common % d == 0)
            raise ValueError(
                f"ulysses shards heads over cp={cp_size} ranks, but {' and '.join(bad)} "
                f"{'is' if len(bad) == 1 else 'are'} not divisible by {cp_size}{''.join(other)}; choose a cp "
                f"that divides both ({fits})"
            )

    @classmethod
    def communication(cls, case: CommCase) -> Volume:
        """Per all-to-all, each way (forward: 2, backward: 2 more), with L = T / cp and e the dtype's bytes:
        Q/K/V/B/A out B L (cp - 1) (2 Hk K + Hv V + 2 Hv) / cp e; outputs back B L (cp - 1) Hv V / cp e.
        Every call starts with the header (`header_volume`); a prefill ends with its state sum
        (`final_state_volume`)."""
        config, cp, batch = case.config, case.cp, case.batch
        e = torch.empty((), dtype=config.dtype).element_size()
        L, passes = case.seq_len // cp, 2 if case.backward else 1
        Hk, Hv, K, V = config.num_k_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim
        packed = batch * L * (cp - 1) * (2 * Hk * K + Hv * V + 2 * Hv) // cp * e
        outputs = batch * L * (cp - 1) * Hv * V // cp * e
        volume: Volume = {}
        cls.header_volume(volume, case)
        cls.final_state_volume(volume, case)
        add_volume(volume, "all_to_all", passes * (packed + outputs), passes * (packed + outputs), 2 * passes)
        return volume

    def _to_heads(self, x: torch.Tensor, plan: ShardPlan) -> torch.Tensor:
        """[B, L, cp, ch] (channels of each destination rank's heads) -> [B, T, ch] in global order."""
        full = all_to_all(
            x, scatter_dim=2, gather_dim=1, group=self.group, gather_sizes=plan.shard_lengths()
        ).squeeze(2)
        order = plan.rank_order(x.device)
        return full if order is None else full.index_select(1, torch.argsort(order))

    def _to_sequence(self, o: torch.Tensor, plan: ShardPlan) -> torch.Tensor:
        """[B, T, h, V] in global order -> [B, L, cp * h, V] this rank's shard, every head."""
        order = plan.rank_order(o.device)
        o = o if order is None else o.index_select(1, order)
        out = all_to_all(o, scatter_dim=1, gather_dim=2, group=self.group, scatter_sizes=plan.shard_lengths())
        if mutants.ACTIVE is not None:  # a test's mutation of what arrived (gdn_cp.distributed.mutants)
            out = mutants.returned_outputs(out, self.rank, self.size)
        return out

    def layer_shard(
        self, layer: GatedDeltaNet, x: torch.Tensor, cu_seqlens: torch.Tensor | None, final_state: bool
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        c, cp, r = layer.config, self.size, self.rank
        B, L, _ = x.shape
        signature = self.layer_signature(c, x, final_state)
        plan, bounds = self.plan_by_header(signature, L, cu_seqlens, x.device, self.layer_check(layer, x))
        ran.note(local_path=self.local_path(self.options, self.backend(c.backend)))
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
        mixed, b, a = self._to_heads(packed, plan).split([2 * kd + vd, hv, hv], dim=-1)

        # This rank's q, k and v channels of the fused conv, in the conv weight and state alike.
        channels = (
            slice(r * kd, (r + 1) * kd),
            slice(c.key_dim + r * kd, c.key_dim + (r + 1) * kd),
            slice(2 * c.key_dim + r * vd, 2 * c.key_dim + (r + 1) * vd),
        )
        w_local = torch.cat([layer.conv1d.weight[s] for s in channels])
        ql, kl, vl = layer.split_qkv(causal_conv1d(mixed, w_local, cu_seqlens=bounds))
        heads = slice(r * hv, (r + 1) * hv)
        o, final = layer.core(
            ql,
            kl,
            vl,
            a,
            b,
            heads=heads,
            cu_seqlens=bounds,
            output_final_state=final_state,
            backend=self.backend(c.backend),
        )  # [B, T, hv, V]
        out = layer.output(self._to_sequence(o, plan), p.z)
        if final is None:
            return out, None
        # This rank holds the whole sequence of its heads and channels: its share is theirs, zeros elsewhere.
        local_conv = conv_state(mixed, c.conv_kernel_size, bounds)
        conv = local_conv.new_zeros(local_conv.shape[0], c.conv_dim, c.conv_kernel_size)
        for s, part in zip(channels, local_conv.split([kd, kd, vd], dim=1), strict=True):
            conv[:, s] = part
        return out, (conv, self._heads_share(final, heads, c.num_v_heads))

    @staticmethod
    def _heads_share(final: torch.Tensor, heads: slice, num_v_heads: int) -> torch.Tensor:
        """This rank's heads [N, h, K, V] of the final states, in place in zeros of all [N, Hv, K, V]."""
        share = final.new_zeros(final.shape[0], num_v_heads, *final.shape[2:])
        share[:, heads] = final
        return share

    def gated_delta_rule(self, q, k, v, g, beta, **kwargs):
        """As CPMode's, but checking the heads first: they must divide over cp (the same on every rank)."""
        for name, n in (("q/k", q.shape[2]), ("v", v.shape[2])):
            if n % self.size:
                raise ValueError(
                    f"ulysses shards heads over cp={self.size} ranks, but {name} has {n} heads: choose a cp "
                    "that divides the heads, or mode p2p / all_gather"
                )
        return super().gated_delta_rule(q, k, v, g, beta, **kwargs)

    def sharded_rule(
        self,
        plan: ShardPlan,
        inputs: tuple[torch.Tensor, ...],
        *,
        scale: float | None,
        initial_state: torch.Tensor | None,
        output_final_state: bool,
        use_qk_l2norm_in_kernel: bool,
        documents: list[int] | None,
        chunk_size: int,
        backend: Backend,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ran.note(local_path=self.local_path(self.options, backend))
        q, k, v, g, beta = inputs
        cp, r = self.size, self.rank
        B, L, Hk, K = k.shape
        Hv, V = v.shape[2], v.shape[3]
        hk, hv = Hk // cp, Hv // cp
        # One all-to-all for the five inputs, [B, L, cp, channels of the destination's heads]; the gates
        # travel apart only when their dtype differs (a log-decay must not be rounded to bf16 on the way).
        qkv = [q.reshape(B, L, cp, hk * K), k.reshape(B, L, cp, hk * K), v.reshape(B, L, cp, hv * V)]
        gates = [g.reshape(B, L, cp, hv), beta.reshape(B, L, cp, hv)]
        if g.dtype == beta.dtype == q.dtype:
            ql, kl, vl, gl, bl = self._to_heads(torch.cat(qkv + gates, dim=-1), plan).split(
                [hk * K, hk * K, hv * V, hv, hv], dim=-1
            )
        else:
            ql, kl, vl = self._to_heads(torch.cat(qkv, dim=-1), plan).split([hk * K, hk * K, hv * V], dim=-1)
            gl, bl = self._to_heads(
                torch.cat([x.to(torch.promote_types(g.dtype, beta.dtype)) for x in gates], -1), plan
            ).split([hv, hv], dim=-1)
        T = ql.shape[1]
        heads = slice(r * hv, (r + 1) * hv)
        o, final = backend.rule(
            ql.reshape(B, T, hk, K),
            kl.reshape(B, T, hk, K),
            vl.reshape(B, T, hv, V),
            gl.to(g.dtype),
            bl.to(beta.dtype),
            scale=scale,
            initial_state=None if initial_state is None else initial_state[:, heads],
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            cu_seqlens=documents,
            chunk_size=chunk_size,
        )
        o = self._to_sequence(o, plan)
        return o, (None if final is None else self._heads_share(final, heads, Hv))
