"""Segments of a shard as affine functions of the states entering them, through any backend op
(gdn_cp.ops.backends): what the sequence-shard CP modes need of the local op when it is not gdn_cp's own
(gdn_cp.ops.chunk.summarise_chunks is that).

A segment that reads the state H_in entering it (it continues a document from an earlier piece) is computed
at value width V + K: v_ext = [v | 0_K], entering with [0 | I] (or [its fresh state | 0], where a caller wants
the term for a segment that starts a document). The recurrence is linear in the state, so the columns evolve
apart and the last K carry the product of the token maps applied to I:

    final_ext = [S | M]            H_out = M @ H_in + S   (M = 0 for a segment that starts a document)
    o_ext     = [o_free | q_eff]   o = o_free + q_eff @ H_in

A segment that starts a document needs nothing of H_in and runs at width V from its fresh state. Two uses:

- `affine_rule`: the reading segments so, before H_in is known; `AffineOutputs.with_entering_states` finishes
  the outputs once it is (one call of the op per kind of segment; the outputs' state-free part is computed
  before the exchange). gdn_cp.ops.split_chunk_outputs is the same trick inside the chunk scan.
- `segment_summaries`: only the packed [S | M] of some segments, from the backend's summary hook (or the
  seam's call at V + K without a graph: gdn_cp.ops.backends.Backend.summarise), then `segment_outputs`: the
  outputs at width V once the entering states are known. The summaries' backward is KCP's (fla.ops.cp):
  their dS, which the exchange's backward folds from the later pieces, flows through one more call of the op
  at width V from the entering state (dM is not read: (S, M) is used only as M H_in + S, so dM = dS H_in^T,
  which that call applies); nothing is differentiated at width V + K.

The op must be called with the same use_qk_l2norm_in_kernel as the outputs: M is the map of the normalised
keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import TYPE_CHECKING

import torch

from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.ops.inputs import check_gdn_inputs

if TYPE_CHECKING:  # the backends' checks run affine_rule (gdn_cp.ops.backends.checks): no import back
    from gdn_cp.ops.backends.entry import Backend


def _offsets(lengths: Sequence[int]) -> list[int]:
    return [0, *accumulate(lengths)]


def _check_segments(bounds: Sequence[int], carried: Sequence[bool], L: int) -> tuple[int, ...]:
    bounds = tuple(int(b) for b in bounds)
    if bounds[0] != 0 or bounds[-1] != L or any(b <= a for a, b in pairwise(bounds)):
        raise ValueError(f"segment bounds {list(bounds)} must rise strictly from 0 to L = {L}")
    if len(carried) != len(bounds) - 1:
        raise ValueError(f"{len(carried)} carried flags for {len(bounds) - 1} segments: give one per segment")
    return bounds


def _segments_call(
    backend: Backend,
    inputs: Sequence[torch.Tensor],
    spans: Sequence[tuple[int, int]],
    initial_state: torch.Tensor | None,
    extra_columns: int,
    output_final_state: bool,
    kw: dict,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One call of `backend` over the token spans of every batch row, each a sequence of its own, v widened
    by `extra_columns` zero columns; initial_state [B, m, Hv, K, V + extra] or None (zeros):
    (o [B, sum of spans, Hv, V + extra] in order, finals [B, m, Hv, K, V + extra] or None)."""
    q, k, v, g, beta = inputs
    B, _, Hv, V = v.shape
    m = len(spans)
    if extra_columns:
        v = torch.cat([v, v.new_zeros(*v.shape[:-1], extra_columns)], dim=-1)
    h0 = None if initial_state is None else initial_state.flatten(0, 1)
    if m == 1:  # one span a row: the batch as it is
        lo, hi = spans[0]
        o, final = backend.rule(
            *(x[:, lo:hi] for x in (q, k, v, g, beta)),
            initial_state=h0,
            output_final_state=output_final_state,
            **kw,
        )
        return o, (None if final is None else final.unsqueeze(1))
    # Several spans: every row's spans packed into one sequence (B = 1, cu_seqlens), row by row.
    lengths = [hi - lo for lo, hi in spans]
    packed = [
        torch.cat([x[b : b + 1, lo:hi] for b in range(B) for lo, hi in spans], dim=1)
        for x in (q, k, v, g, beta)
    ]
    o, final = backend.rule(
        *packed,
        initial_state=h0,
        output_final_state=output_final_state,
        cu_seqlens=_offsets(lengths * B),
        **kw,
    )
    o = o.reshape(B, sum(lengths), Hv, V + extra_columns)
    return o, (None if final is None else final.reshape(B, m, *final.shape[1:]))


def _segments_summaries(
    backend: Backend, inputs: Sequence[torch.Tensor], spans: Sequence[tuple[int, int]], kw: dict
) -> torch.Tensor:
    """[B, m, Hv, K, V + K] the packed map of each token span of every batch row, in one call of
    Backend.summarise (spans packed as `_segments_call` packs them)."""
    B = inputs[2].shape[0]
    if len(spans) == 1:
        lo, hi = spans[0]
        return backend.summarise(*(x[:, lo:hi] for x in inputs), **kw).unsqueeze(1)
    lengths = [hi - lo for lo, hi in spans]
    packed = [torch.cat([x[b : b + 1, lo:hi] for b in range(B) for lo, hi in spans], dim=1) for x in inputs]
    maps = backend.summarise(*packed, cu_seqlens=_offsets(lengths * B), **kw)
    return maps.reshape(B, len(spans), *maps.shape[1:])


def _extended_states(carried: Sequence[bool], fresh: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """[B, m, Hv, K, V + K]: [0 | I] where carried, [fresh | 0] elsewhere (fresh [B, m, Hv, K, V] or None:
    zeros), in `like`'s dtype and device ([B, ?, Hv, K, V] gives the sizes)."""
    B, _, Hv, K, V = like.shape
    m = len(carried)
    keep = torch.tensor(list(carried), device=like.device).view(1, m, 1, 1, 1)
    base = like.new_zeros(B, m, Hv, K, V) if fresh is None else fresh.to(like.dtype)
    eye = torch.eye(K, dtype=like.dtype, device=like.device).expand(B, m, Hv, K, K)
    return torch.cat([torch.where(keep, 0.0, base), torch.where(keep, eye, 0.0)], dim=-1)


def _state_like(v: torch.Tensor, K: int) -> torch.Tensor:
    """An empty [B, 0, Hv, K, V] in the accumulation dtype: the sizes and dtype of a state."""
    B, _, Hv, V = v.shape
    return v.new_empty(B, 0, Hv, K, V, dtype=accumulation_dtype(v.dtype))


@dataclass(frozen=True, slots=True)
class AffineOutputs:
    """`affine_rule`'s results, by what they need of the states entering the reading segments.

    Segment j holds tokens bounds[j]:bounds[j + 1] of every batch row; `reading` lists the segments computed
    as affine functions of their entering state (in order), the others hold their outputs from their fresh
    state.
    """

    bounds: tuple[int, ...]
    """The n segments' boundaries, 0 .. L."""
    reading: tuple[int, ...]
    """The r segments that read their entering state, increasing."""
    read_outputs: torch.Tensor | None
    """[B, L_r, Hv, V + K] [o_free | q_eff] of the reading segments' tokens, in order (op dtype)."""
    read_maps: torch.Tensor | None
    """[B, r, Hv, K, V + K] [S | M] of each reading segment (accumulation dtype)."""
    fresh_outputs: torch.Tensor | None
    """[B, L - L_r, Hv, V] the outputs of the other segments' tokens, in order (op dtype)."""
    fresh_finals: torch.Tensor | None
    """[B, n - r, Hv, K, V] the other segments' final states, when asked for (accumulation dtype)."""

    @property
    def fresh(self) -> tuple[int, ...]:
        """The segments that do not read their entering state."""
        return tuple(j for j in range(len(self.bounds) - 1) if j not in self.reading)

    def summary(self, segment: int) -> torch.Tensor:
        """[B, Hv, K, V + K] packed [S | M] (gdn_cp.ops.pack_summary): `segment`'s map of its entering
        state, M = 0 for a segment that does not read it."""
        if segment in self.reading:
            assert self.read_maps is not None
            return self.read_maps[:, self.reading.index(segment)]
        if self.fresh_finals is None:
            raise ValueError("affine_rule: the fresh segments' final states were not asked for (finals=True)")
        S = self.fresh_finals[:, self.fresh.index(segment)]
        return torch.cat([S, S.new_zeros(*S.shape[:-1], S.shape[-2])], dim=-1)

    def with_entering_states(
        self, entering: torch.Tensor, output_final_state: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(o [B, L, Hv, V] in the op's dtype, every segment's final state [B, n, Hv, K, V] or None), given
        entering [B, r, Hv, K, V], the state entering each reading segment (not read where r = 0)."""
        if not self.reading:
            return outputs_in_order(
                self.bounds, (), (None, None), (self.fresh_outputs, self.fresh_finals), output_final_state
            )
        assert self.read_outputs is not None and self.read_maps is not None
        K = entering.shape[-2]
        lengths = [hi - lo for lo, hi in pairwise(self.bounds)]
        at = _offsets([lengths[j] for j in self.reading])
        parts = []
        for i in range(len(self.reading)):
            block = self.read_outputs[:, at[i] : at[i + 1]]
            free, q_eff = block[..., :-K].to(entering.dtype), block[..., -K:].to(entering.dtype)
            parts.append((free + torch.einsum("blhk,bhkv->blhv", q_eff, entering[:, i])).to(block.dtype))
        finals = None
        if output_final_state:
            S, M = self.read_maps[..., :-K], self.read_maps[..., -K:]
            finals = S + M @ entering.to(S.dtype)
        read = (torch.cat(parts, dim=1), finals)
        return outputs_in_order(
            self.bounds, self.reading, read, (self.fresh_outputs, self.fresh_finals), output_final_state
        )


def affine_rule(
    backend: Backend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    bounds: Sequence[int],
    carried: Sequence[bool],
    reading: Sequence[int] = (),
    fresh_states: torch.Tensor | None = None,
    finals: bool = False,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> AffineOutputs:
    """The outputs and maps of a shard's segments as affine functions of the states entering the reading
    segments, in one call of `backend` at value width V + K for those and one at width V for the others
    (module docstring); finish with `AffineOutputs.with_entering_states` once those states are known.

    Args:
        q, k: [B, L, Hk, K];  v: [B, L, Hv, V];  g, beta: [B, L, Hv]
        bounds: [n + 1] segment boundaries 0 < ... < L, the same in every batch row
        carried: [n] which segments continue a document (their entering state is H_in)
        reading: more segments to compute as affine functions of their entering state, besides the carried
            ones (for a segment that starts a document its term is exact zeros, which keeps H_in in the graph)
        fresh_states: [B, n, Hv, K, V], the state a segment that starts a document enters with (ignored where
            carried); None: zeros
        finals: also keep the final states of the segments that do not read (for `AffineOutputs.summary` and
            a prefill's final states)
        scale, use_qk_l2norm_in_kernel, chunk_size: as the op's
    """
    check_gdn_inputs(q, k, v, g, beta)
    bounds = _check_segments(bounds, carried, q.shape[1])
    n = len(bounds) - 1
    read = tuple(sorted({j for j in range(n) if carried[j]} | set(reading)))
    fresh = [j for j in range(n) if j not in read]
    spans = list(pairwise(bounds))
    kw = {"scale": scale, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "chunk_size": chunk_size}
    like = _state_like(v, q.shape[-1])
    inputs = (q, k, v, g, beta)
    read_outputs = read_maps = fresh_outputs = fresh_finals = None
    if read:
        given = None if fresh_states is None else fresh_states[:, list(read)]
        h0 = _extended_states([carried[j] for j in read], given, like)
        read_outputs, read_maps = _segments_call(
            backend, inputs, [spans[j] for j in read], h0, q.shape[-1], True, kw
        )
    if fresh:
        given = None if fresh_states is None else fresh_states[:, fresh].to(like.dtype)
        fresh_outputs, fresh_finals = _segments_call(
            backend, inputs, [spans[j] for j in fresh], given, 0, finals, kw
        )
    return AffineOutputs(bounds, read, read_outputs, read_maps, fresh_outputs, fresh_finals)


@dataclass(eq=False)
class SegmentSummaries:
    """`segment_summaries`' result: the maps, and the states entering their segments once known (which their
    backward reads)."""

    maps: torch.Tensor
    """[B, m, Hv, K, V + K] packed [S | M] of each segment (accumulation dtype)."""
    entering: torch.Tensor | None = None
    """[B, m, Hv, K, V]: set by `set_entering` after the exchange, before the backward."""

    def set_entering(self, entering: torch.Tensor) -> None:
        """The state entering each summarised segment, [B, m, Hv, K, V] (read by the backward, not
        differentiated there: its gradient comes from the outputs)."""
        self.entering = entering.detach()


class _Summaries(torch.autograd.Function):
    """The maps without a graph; backward: dS through one call of the op at width V from the entering state
    (module docstring)."""

    @staticmethod
    def forward(ctx, result, backend, spans, kw, q, k, v, g, beta):
        ctx.save_for_backward(q, k, v, g, beta)
        ctx.result, ctx.backend, ctx.spans, ctx.kw = result, backend, spans, kw
        ctx.set_materialize_grads(False)
        return _segments_summaries(backend, (q, k, v, g, beta), spans, kw)

    @staticmethod
    def backward(ctx, d_maps):
        inputs = ctx.saved_tensors
        if d_maps is None:
            return (None,) * (4 + len(inputs))
        if ctx.result.entering is None:
            raise RuntimeError("segment_summaries: set_entering was not called before the backward")
        V = inputs[2].shape[-1]
        with torch.enable_grad():
            needs = ctx.needs_input_grad[4:]
            leaves = [t.detach().requires_grad_(n) for t, n in zip(inputs, needs, strict=True)]
            _, finals = _segments_call(ctx.backend, leaves, ctx.spans, ctx.result.entering, 0, True, ctx.kw)
            wanted = [t for t in leaves if t.requires_grad]
            d_finals = d_maps[..., :V].to(finals.dtype)
            found = iter(torch.autograd.grad(finals, wanted, d_finals, allow_unused=True))
        grads = [next(found) if t.requires_grad else None for t in leaves]
        return (None, None, None, None, *grads)


def segment_summaries(
    backend: Backend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    bounds: Sequence[int],
    segments: Sequence[int],
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> SegmentSummaries:
    """The packed [S | M] of each of `segments` (m of them) as a map of its entering state, from the backend's
    summary hook or the seam (Backend.summarise), in one call, without outputs or graph. Call
    `SegmentSummaries.set_entering` once the entering states are known: the backward runs the op at width V
    from them (module docstring), so the maps' gradient must come from where they are used as M H_in + S.

    q, k: [B, L, Hk, K];  v: [B, L, Hv, V];  g, beta: [B, L, Hv];  bounds: [n + 1] segment boundaries
    0 < ... < L, the same in every batch row; scale, use_qk_l2norm_in_kernel, chunk_size: as the op's.
    """
    check_gdn_inputs(q, k, v, g, beta)
    bounds = _check_segments(bounds, [False] * (len(bounds) - 1), q.shape[1])
    spans = [(bounds[j], bounds[j + 1]) for j in segments]
    kw = {"scale": scale, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "chunk_size": chunk_size}
    result = SegmentSummaries(maps=torch.empty(0))
    result.maps = _Summaries.apply(result, backend, spans, kw, q, k, v, g, beta)
    return result


def segment_outputs(
    backend: Backend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    bounds: Sequence[int],
    segments: Sequence[int],
    states: torch.Tensor | None,
    output_final_state: bool = False,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The outputs of `segments` (m of them) at width V in one call of `backend`, each from its state:
    (o [B, L_m, Hv, V] of their tokens in order, final states [B, m, Hv, K, V] or None). states:
    [B, m, Hv, K, V] or None (zeros); other arguments as `segment_summaries`'. Put the pieces back in order
    with `outputs_in_order`."""
    check_gdn_inputs(q, k, v, g, beta)
    bounds = _check_segments(bounds, [False] * (len(bounds) - 1), q.shape[1])
    spans = [(bounds[j], bounds[j + 1]) for j in segments]
    kw = {"scale": scale, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "chunk_size": chunk_size}
    given = None if states is None else states.to(_state_like(v, q.shape[-1]).dtype)
    return _segments_call(backend, (q, k, v, g, beta), spans, given, 0, output_final_state, kw)


def segments_rule(
    backend: Backend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    bounds: Sequence[int],
    reading: Sequence[int],
    entering: torch.Tensor,
    fresh_states: torch.Tensor | None = None,
    output_final_state: bool = False,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The outputs of a shard's segments once the states entering them are known, in one call of `backend`
    at width V for the `reading` segments and one for the others: (o [B, L, Hv, V] in the op's dtype, every
    segment's final state [B, n, Hv, K, V] or None).

    entering: [B, r, Hv, K, V], the state entering each reading segment; fresh_states: [B, n, Hv, K, V], what
    the others enter with (None: zeros); other arguments as `affine_rule`'s.
    """
    check_gdn_inputs(q, k, v, g, beta)
    bounds = _check_segments(bounds, [False] * (len(bounds) - 1), q.shape[1])
    spans = list(pairwise(bounds))
    kw = {"scale": scale, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "chunk_size": chunk_size}
    inputs, like = (q, k, v, g, beta), _state_like(v, q.shape[-1])
    reading = tuple(sorted(reading))
    fresh = [j for j in range(len(spans)) if j not in reading]
    read = _segments_call(
        backend, inputs, [spans[j] for j in reading], entering.to(like.dtype), 0, output_final_state, kw
    )
    rest = (None, None)
    if fresh:
        given = None if fresh_states is None else fresh_states[:, fresh].to(like.dtype)
        rest = _segments_call(backend, inputs, [spans[j] for j in fresh], given, 0, output_final_state, kw)
    return outputs_in_order(bounds, reading, read, rest, output_final_state)


def outputs_in_order(
    bounds: tuple[int, ...],
    reading: Sequence[int],
    read: tuple[torch.Tensor | None, torch.Tensor | None],
    rest: tuple[torch.Tensor | None, torch.Tensor | None],
    output_final_state: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The outputs [B, L, ...] and final states [B, n, ...] of the segments in order, from those of the
    reading segments (`read`: outputs of their tokens in order, finals; (None, None) where there are none)
    and of the others (`rest`)."""
    lengths = [hi - lo for lo, hi in pairwise(bounds)]
    fresh = [j for j in range(len(lengths)) if j not in reading]
    read_at = _offsets([lengths[j] for j in reading])
    rest_at = _offsets([lengths[j] for j in fresh])
    parts, finals = [], []
    for j in range(len(lengths)):
        (o, final), at, i = (
            (read, read_at, reading.index(j)) if j in reading else (rest, rest_at, fresh.index(j))
        )
        assert o is not None
        parts.append(o[:, at[i] : at[i + 1]])
        if output_final_state:
            assert final is not None
            finals.append(final[:, i])
    o = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return o, (torch.stack(finals, dim=1) if output_final_state else None)
