"""Backend fla's summaries-then-outputs pair (gdn_cp.ops.backends.KCPRule): FLA's KCP (fla.ops.cp) through
its own forward and backward pieces (fla-core 0.6, fla.ops.gated_delta_rule.chunk), what the summary modes run
on backend fla. The structure is gdn_cp.ops.chunk.deferred's:

- `FlaSummary`: FLA's intra pass (l2norm, chunk cumsum of the log2 gates, K K^T, the UT transform, w, u) once,
  then the packed [S | M] of the summarised sequences with FLA's KCP kernel (gdn_cp.ops.backends.fla_summary),
  no outputs;
- `FlaOutputs`: FLA's state pass and outputs at width V (`chunk_gated_delta_rule_fwd_h`, `chunk_fwd_o`) from
  each sequence's entering state, on the same intra pass;
- backward: where a summary was taken, the outputs' backward is KCP's pre-pass (`chunk_bwd_dv_local` and the
  reverse state chain `chunk_gated_delta_rule_bwd_dhu` from the final states' gradients: dH_in); the
  summary's backward is FLA's backward once (`chunk_bwd_dqkwg`, `prepare_wy_repr_bwd`, ...) with dS, which the
  exchange's backward folded from the later pieces, added to the final states' gradients (dM = dS H_in^T,
  not read: gdn_cp.ops.chunk.deferred).

`recompute` (checkpoint_summary): keep what FLA's own op keeps (its inputs and the UT transforms) and
recompute w, u and the chunk states in backward, as FLA does; off: keep them. The segments of every batch row
are FLA's varlen sequences (rows concatenated, B = 1), in chunks of their own.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

import torch

from gdn_cp.ops.backends.fla_summary import state_maps


def _fla():
    """FLA's pieces, imported on first use."""
    names = {
        "norm": "fla.modules.norm.l2norm",
        "utils": "fla.ops.utils",
        "constant": "fla.ops.utils.constant",
        "index": "fla.ops.utils.index",
        "intra": "fla.ops.gated_delta_rule.chunk_fwd",
        "wy": "fla.ops.gated_delta_rule.wy_fast",
        "delta_h": "fla.ops.common.chunk_delta_h",
        "chunk_o": "fla.ops.common.chunk_o",
    }
    return {key: importlib.import_module(module) for key, module in names.items()}


class Prepared(NamedTuple):
    """FLA's inputs after its intra pass, [1, B L, ...]: l2-normalised q, k (and their reciprocal norms, None
    without the norm), the chunk-cumulated log2 gates, w, u and the UT transforms A."""

    q: torch.Tensor
    q_rstd: torch.Tensor | None
    k: torch.Tensor
    k_rstd: torch.Tensor | None
    g: torch.Tensor
    w: torch.Tensor | None
    u: torch.Tensor | None
    A: torch.Tensor


@dataclass(eq=False)
class FlaLink:
    """What the two Functions share (as gdn_cp.ops.chunk.deferred.Link), per FLA sequence (row b's segment j
    is sequence b n + j)."""

    cu_seqlens: torch.Tensor
    chunk_indices: torch.Tensor
    carried: tuple[bool, ...]
    summarised: tuple[int, ...]
    maps: tuple[bool, ...]
    scale: float
    l2norm: bool
    chunk_size: int
    recompute: bool
    prepared: Prepared | None = field(default=None, repr=False)
    pending: tuple | None = field(default=None, repr=False)

    @property
    def deferred(self) -> bool:
        return bool(self.summarised)

    def carried_mask(self, device: torch.device) -> torch.Tensor:
        return torch.tensor(self.carried, device=device).view(-1, 1, 1, 1)


def _prepare(q, k, v, g, beta, link: FlaLink) -> Prepared:
    fla = _fla()
    q_rstd = k_rstd = None
    if link.l2norm:
        q, q_rstd = fla["norm"].l2norm_fwd(q)
        k, k_rstd = fla["norm"].l2norm_fwd(k)
    cu, indices, C = link.cu_seqlens, link.chunk_indices, link.chunk_size
    g = fla["utils"].chunk_local_cumsum(
        g, chunk_size=C, scale=fla["constant"].RCP_LN2, cu_seqlens=cu, chunk_indices=indices
    )
    w, u, A = fla["intra"].chunk_gated_delta_rule_fwd_intra(
        k=k, v=v, g=g, beta=beta, cu_seqlens=cu, chunk_indices=indices, chunk_size=C
    )
    return Prepared(q, q_rstd, k, k_rstd, g, w, u, A)


def _summaries(p: Prepared, link: FlaLink, fresh: torch.Tensor | None) -> torch.Tensor:
    """[m, Hv, K, V + K] the summarised sequences' [S | M] (M = 0 where not wanted, S then from the fresh
    state)."""
    K, (HV, V) = p.k.shape[-1], p.u.shape[2:]
    out = torch.zeros(len(link.summarised), HV, K, V + K, dtype=torch.float32, device=p.k.device)
    for i, (s, wanted) in enumerate(zip(link.summarised, link.maps, strict=True)):
        start = None if wanted or fresh is None else fresh[s].float()
        cu = link.cu_seqlens[s : s + 2]
        state_maps(p.k, p.w, p.u, p.g, cu, out[i : i + 1], link.chunk_size, maps=wanted or start is not None)
        if not wanted:
            if start is not None:  # S from the fresh state: S0 + M h0
                out[i, ..., :V] += out[i, ..., V:] @ start
            out[i, ..., V:] = 0
    return out


def _main_backward(saved: tuple, link: FlaLink, do, dht, dv_local=None):
    """FLA's backward (chunk_gated_delta_rule_bwd) on kept or recomputed w, u and states: (dq, dk, dv, dg,
    dbeta, dh0), in FLA's layout."""
    fla = _fla()
    p, v, beta, h0, kept = saved
    cu, indices, C, scale = link.cu_seqlens, link.chunk_indices, link.chunk_size, link.scale
    if kept is None:
        w, u = fla["wy"].recompute_w_u_fwd(
            k=p.k, v=v, beta=beta, A=p.A, g=p.g, cu_seqlens=cu, chunk_indices=indices
        )
        h, v_new, _ = fla["delta_h"].chunk_gated_delta_rule_fwd_h(
            k=p.k,
            w=w,
            u=u,
            g=p.g,
            initial_state=h0,
            output_final_state=False,
            cu_seqlens=cu,
            chunk_indices=indices,
            chunk_size=C,
        )
    else:
        w, h, v_new = kept
    dh, dh0, dv, _ = _state_grads(p, link, w, h0, do, dht, dv_local)
    dq, dk, dw, dg = fla["chunk_o"].chunk_bwd_dqkwg(
        q=p.q,
        k=p.k,
        v=v_new,
        w=w,
        g=p.g,
        h=h,
        dv=dv,
        do=do,
        dh=dh,
        scale=scale,
        cu_seqlens=cu,
        chunk_indices=indices,
        chunk_size=C,
    )
    dk2, dv, db, dg2 = fla["wy"].prepare_wy_repr_bwd(
        k=p.k, v=v, beta=beta, g=p.g, A=p.A, dw=dw, du=dv, cu_seqlens=cu, chunk_indices=indices
    )
    dk.add_(dk2)
    dg.add_(dg2)
    dg = fla["utils"].chunk_local_cumsum(dg, chunk_size=C, reverse=True, cu_seqlens=cu, chunk_indices=indices)
    if link.l2norm:
        dq = fla["norm"].l2norm_bwd(p.q, p.q_rstd, dq)
        dk = fla["norm"].l2norm_bwd(p.k, p.k_rstd, dk)
    return dq, dk, dv, dg, db, dh0


def _pre_pass(saved: tuple, link: FlaLink, do, dht):
    """KCP's pre-pass: (dL/d(each sequence's entering state) from its own outputs and final state, the local
    dv that the one backward reuses)."""
    fla = _fla()
    p, _, _, h0, kept = saved
    cu, indices = link.cu_seqlens, link.chunk_indices
    w = (
        kept[0]
        if kept is not None
        else fla["wy"].recompute_w_u_fwd(
            k=p.k, v=saved[1], beta=saved[2], A=p.A, g=p.g, cu_seqlens=cu, chunk_indices=indices
        )[0]
    )
    _, dh0, _, dv_local = _state_grads(p, link, w, h0, do, dht)
    return dh0, dv_local


def _state_grads(p: Prepared, link: FlaLink, w, h0, do, dht, dv_local=None):
    """FLA's backward through the states (chunk_gated_delta_rule_bwd_dhu), from the local dv (computed from
    `do` where not given): (dh per chunk, dh0, dv, the local dv)."""
    fla = _fla()
    cu, indices, C, scale = link.cu_seqlens, link.chunk_indices, link.chunk_size, link.scale
    if dv_local is None:
        dv_local = fla["chunk_o"].chunk_bwd_dv_local(
            q=p.q, k=p.k, g=p.g, do=do, scale=scale, cu_seqlens=cu, chunk_indices=indices, chunk_size=C
        )
    dh, dh0, dv = fla["delta_h"].chunk_gated_delta_rule_bwd_dhu(
        q=p.q,
        k=p.k,
        w=w,
        g=p.g,
        h0=h0,
        dht=dht,
        do=do,
        dv=dv_local,
        scale=scale,
        cu_seqlens=cu,
        chunk_indices=indices,
        chunk_size=C,
    )
    return dh, dh0, dv, dv_local


class FlaSummary(torch.autograd.Function):
    """FLA's intra pass and the summarised sequences' [S | M]; backward: FLA's backward once, with dS."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, fresh, link):
        with torch.no_grad():
            link.prepared = _prepare(q, k, v, g, beta, link)
            packed = _summaries(link.prepared, link, fresh)
        ctx.link, ctx.has_fresh = link, fresh is not None
        ctx.set_materialize_grads(False)
        return packed

    @staticmethod
    def backward(ctx, d_packed):
        link = ctx.link
        if link.pending is None:
            raise RuntimeError("the fla summary's backward ran before the outputs' backward")
        (do, dht, dv_local, saved), link.pending = link.pending, None
        dht = dht.clone()
        if d_packed is not None:
            V = dht.shape[-1]
            index = torch.tensor(link.summarised, device=dht.device)
            dht.index_add_(0, index, d_packed[..., :V].to(dht.dtype))
        dq, dk, dv, dg, db, dh0 = _main_backward(saved, link, do, dht, dv_local)
        d_fresh = torch.where(link.carried_mask(dh0.device), 0.0, dh0) if ctx.has_fresh else None
        return dq, dk, dv, dg, db, d_fresh, None


class FlaOutputs(torch.autograd.Function):
    """FLA's state pass and outputs at width V from each sequence's entering state; deferred: its backward is
    the pre-pass."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, h_start, link):
        fla = _fla()
        with torch.no_grad():
            p = link.prepared if link.prepared is not None else _prepare(q, k, v, g, beta, link)
            link.prepared = None
            cu, indices, C = link.cu_seqlens, link.chunk_indices, link.chunk_size
            h, v_new, final = fla["delta_h"].chunk_gated_delta_rule_fwd_h(
                k=p.k,
                w=p.w,
                u=p.u,
                g=p.g,
                initial_state=h_start,
                output_final_state=True,
                cu_seqlens=cu,
                chunk_indices=indices,
                chunk_size=C,
            )
            o = fla["chunk_o"].chunk_fwd_o(
                q=p.q,
                k=p.k,
                v=v_new,
                h=h,
                g=p.g,
                scale=link.scale,
                cu_seqlens=cu,
                chunk_indices=indices,
                chunk_size=C,
            )
        kept = None if link.recompute else (p.w, h, v_new)
        ctx.saved = (p._replace(w=None, u=None), v, beta, h_start, kept)
        ctx.link = link
        ctx.set_materialize_grads(False)
        return o.to(q.dtype), final

    @staticmethod
    def backward(ctx, do, dht):
        link, saved = ctx.link, ctx.saved
        h0 = saved[3]
        do = torch.zeros_like(saved[1]) if do is None else do.contiguous()
        dht = torch.zeros_like(h0) if dht is None else dht.contiguous()
        if not link.deferred:
            dq, dk, dv, dg, db, dh0 = _main_backward(saved, link, do, dht)
            return dq, dk, dv, dg, db, dh0, None
        dh0, dv_local = _pre_pass(saved, link, do, dht)
        link.pending = (do, dht, dv_local, saved)
        return None, None, None, None, None, torch.where(link.carried_mask(dh0.device), dh0, 0.0), None


@dataclass(frozen=True, slots=True)
class FlaSummarised:
    """`fla_summarise`'s result, as gdn_cp.ops.SummarisedChunks: the summaries now, the outputs once the
    entering states are known."""

    summaries: torch.Tensor
    """[B, m, Hv, K, V + K] fp32."""
    inputs: tuple[torch.Tensor, ...]
    fresh: torch.Tensor | None
    link: FlaLink
    shape: tuple[int, int, int]
    """(B, n segments, L)."""

    def with_entering_states(
        self, entering: torch.Tensor, output_final_state: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(o [B, L, Hv, V], each segment's final state [B, n, Hv, K, V] or None) from entering
        [B, n, Hv, K, V] (read where carried)."""
        B, n, L = self.shape
        h = entering.flatten(0, 1).float()
        base = torch.zeros_like(h) if self.fresh is None else self.fresh
        h_start = torch.where(self.link.carried_mask(h.device), h, base)
        o, final = FlaOutputs.apply(*self.inputs, h_start, self.link)
        o = o.reshape(B, L, *o.shape[2:])
        return o, (final.reshape(B, n, *final.shape[1:]) if output_final_state else None)


def fla_summarise(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    carried: Sequence[bool],
    summarised: Sequence[int],
    maps: Sequence[bool] | None = None,
    fresh_state: torch.Tensor | None = None,
    recompute: bool = True,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> FlaSummarised:
    """gdn_cp.ops.summarise_chunks' contract on FLA's kernels (its arguments; no resets: every segment is an
    FLA sequence of its own): the packed [S | M] of the `summarised` segments of every batch row, and the
    outputs to follow (module docstring)."""
    index = importlib.import_module("fla.ops.utils.index")
    B, L, _, K = q.shape
    bounds = [int(b) for b in cu_seqlens]
    n = len(bounds) - 1
    maps = tuple(carried[j] for j in summarised) if maps is None else tuple(maps)
    cu = torch.tensor(
        [0] + [b * L + hi for b in range(B) for _, hi in pairwise(bounds)], dtype=torch.long, device=q.device
    )
    link = FlaLink(
        cu_seqlens=cu,
        chunk_indices=index.prepare_chunk_indices(cu, chunk_size),
        carried=tuple(bool(carried[j]) for _ in range(B) for j in range(n)),
        summarised=tuple(b * n + j for b in range(B) for j in summarised),
        maps=tuple(m for _ in range(B) for m in maps),
        scale=K**-0.5 if scale is None else scale,
        l2norm=use_qk_l2norm_in_kernel,
        chunk_size=chunk_size,
        recompute=recompute,
    )
    # FLA's kernels index contiguous memory (its own entry points make inputs so: input_guard); a layer's q,
    # k, v are views of one projection
    inputs = tuple(x.reshape(1, B * L, *x.shape[2:]).contiguous() for x in (q, k, v, g, beta))
    fresh = None if fresh_state is None else fresh_state.flatten(0, 1).float()
    if summarised:
        packed = FlaSummary.apply(*inputs, fresh, link)
        summaries = packed.reshape(B, len(summarised), *packed.shape[1:])
    else:
        summaries = q.new_zeros(B, 0, v.shape[2], K, v.shape[3] + K, dtype=torch.float32)
    return FlaSummarised(summaries, inputs, fresh, link, (B, n, L))


def load_fla_kcp():
    """The pair, after the op has loaded (which prepares Triton's interpreter where it runs)."""
    return fla_summarise
