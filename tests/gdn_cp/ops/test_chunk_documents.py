"""Packed documents (cu_seqlens) in the single-device ops and the layer: every document as if alone.

The chunked op with cu_seqlens is checked against the chunked op run on each document separately (and both
against the recurrent reference), so a state, a chunk or a Conv1D tap that crossed a boundary would show as
an O(1) error; bars follow the tolerance rule of tests/gdn_cp/ops/helpers.py.
"""

from __future__ import annotations

import re
from itertools import pairwise

import pytest
import torch

from gdn_cp import GatedDeltaNet, GatedDeltaNetConfig
from gdn_cp.ops import (
    apply_summary,
    causal_conv1d,
    chunk_gated_delta_rule,
    chunk_outputs,
    document_positions,
    gdn_state_summary,
    prepare_chunks,
    recurrent_gated_delta_rule,
)
from tests.gdn_cp.ops.helpers import Shape, assert_close_scaled, gdn_inputs, weighted_sum

F64 = torch.float64
DOCUMENTS = {
    "one-token-docs": [0, 1, 2, 3, 20],
    "chunk-aligned": [0, 4, 8, 20],
    "ragged": [0, 5, 6, 13, 20],
    "one": [0, 20],
}


def _states(n: int, shape: Shape, seed: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 0.5 * torch.randn(n, shape.Hv, shape.K, shape.V, generator=gen, dtype=F64)


def _per_document(op, x, bounds, h0, **kw):
    """`op` on every document alone: outputs concatenated, final states stacked."""
    outs, finals = [], []
    for j, (a, b) in enumerate(pairwise(bounds)):
        o, h = op(*x.slice(a, b), initial_state=h0[j : j + 1], output_final_state=True, **kw)
        outs.append(o)
        finals.append(h)
    return torch.cat(outs, dim=1), torch.cat(finals)


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_chunk_without_states_shares_chunks_and_is_every_document_alone(name, chunk_size) -> None:
    """No initial or final states: the documents share chunks, kept apart by masks (no padding)."""
    bounds = DOCUMENTS[name]
    shape = Shape(1, bounds[-1], 2, 4, 8, 6)
    x = gdn_inputs(shape, unit_qk=True, requires_grad=True)
    o, _ = chunk_gated_delta_rule(*x, cu_seqlens=torch.tensor(bounds), chunk_size=chunk_size)
    o_ref = torch.cat(
        [chunk_gated_delta_rule(*x.slice(a, b), chunk_size=chunk_size)[0] for a, b in pairwise(bounds)], 1
    )
    terms = shape.T * shape.K
    assert_close_scaled(o, o_ref, F64, terms=terms)
    grads = torch.autograd.grad(weighted_sum(o), list(x))
    expected = torch.autograd.grad(weighted_sum(o_ref), list(x))
    for name_, got, want in zip(("q", "k", "v", "g", "beta"), grads, expected, strict=True):
        assert_close_scaled(got, want, F64, terms=terms, msg=name_)


def test_resets_inside_a_segment() -> None:
    """prepare_chunks(resets=...): the state restarts from zeros at each reset (one at the first token
    discards the entering state), and the summary is the map from the entering state to the end."""
    shape = Shape(1, 30, 2, 4, 8, 6)
    x = gdn_inputs(shape, unit_qk=True)
    H = _states(1, shape)
    for resets in ([5, 17], [0, 5, 17]):
        chunks = prepare_chunks(*x, chunk_size=4, resets=resets)
        o, h = chunk_outputs(chunks, H, output_final_state=True)
        starts = [0, *(r for r in resets if r), 30]
        outs, final = [], None
        for j, (a, b) in enumerate(pairwise(starts)):
            enters = H if j == 0 and 0 not in resets else None
            out, final = chunk_gated_delta_rule(*x.slice(a, b), initial_state=enters, output_final_state=True)
            outs.append(out)
        assert_close_scaled(o, torch.cat(outs, 1), F64, terms=30)
        assert_close_scaled(h, final, F64, terms=30)
        assert_close_scaled(apply_summary(gdn_state_summary(chunks), H), final, F64, terms=30)


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_chunk_with_cu_seqlens_is_every_document_alone(name, chunk_size) -> None:
    bounds = DOCUMENTS[name]
    shape = Shape(1, bounds[-1], 2, 4, 8, 6)
    x = gdn_inputs(shape, unit_qk=True, requires_grad=True)
    h0 = _states(len(bounds) - 1, shape).requires_grad_()
    kw = {"chunk_size": chunk_size}
    o, h = chunk_gated_delta_rule(
        *x, initial_state=h0, output_final_state=True, cu_seqlens=torch.tensor(bounds), **kw
    )
    o_ref, h_ref = _per_document(chunk_gated_delta_rule, x, bounds, h0, **kw)
    o_rec, h_rec = recurrent_gated_delta_rule(
        *x, initial_state=h0, output_final_state=True, cu_seqlens=torch.tensor(bounds)
    )
    terms = shape.T * shape.K
    for actual, expected in ((o, o_ref), (h, h_ref), (o, o_rec), (h, h_rec)):
        assert_close_scaled(actual, expected, F64, terms=terms)
    grads = torch.autograd.grad(weighted_sum(o, h), [*x, h0])
    expected = torch.autograd.grad(weighted_sum(o_ref, h_ref), [*x, h0])
    for name_, got, want in zip(("q", "k", "v", "g", "beta", "h0"), grads, expected, strict=True):
        assert_close_scaled(got, want, F64, terms=terms, msg=name_)


def test_prepared_segments_shared_by_a_batch() -> None:
    """prepare_chunks / chunk_outputs (the CP pieces) take segments shared by every row, B > 1, with one
    initial state per row and segment; gdn_state_summary(segment=j) is segment j's affine map."""
    bounds = [0, 3, 9, 14]
    shape = Shape(2, 14, 2, 4, 8, 6)
    x = gdn_inputs(shape, unit_qk=True)
    gen = torch.Generator().manual_seed(4)
    h0 = 0.5 * torch.randn(2, 3, shape.Hv, shape.K, shape.V, generator=gen, dtype=F64)
    chunks = prepare_chunks(*x, chunk_size=4, cu_seqlens=bounds)
    o, h = chunk_outputs(chunks, h0, output_final_state=True)
    assert h.shape == (2, 3, shape.Hv, shape.K, shape.V)
    for j, (a, b) in enumerate(pairwise(bounds)):
        o_j, h_j = chunk_gated_delta_rule(*x.slice(a, b), initial_state=h0[:, j], output_final_state=True)
        assert_close_scaled(o[:, a:b], o_j, F64, terms=b - a)
        assert_close_scaled(h[:, j], h_j, F64, terms=b - a)
        assert_close_scaled(
            apply_summary(gdn_state_summary(chunks, segment=j), h0[:, j]), h_j, F64, terms=b - a
        )


def test_causal_conv1d_never_reads_across_a_boundary() -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 12, 5, generator=gen, dtype=F64)
    w = torch.randn(5, 4, generator=gen, dtype=F64)
    halo = torch.randn(2, 2, 5, generator=gen, dtype=F64)
    bounds = [0, 1, 3, 4, 12]
    got = causal_conv1d(x, w, halo, cu_seqlens=bounds)
    # The halo continues the first document only; every later one starts from zeros.
    pieces = [causal_conv1d(x[:, :1], w, halo)] + [
        causal_conv1d(x[:, a:b], w) for a, b in pairwise(bounds[1:])
    ]
    assert_close_scaled(got, torch.cat(pieces, dim=1), F64, terms=4)
    assert torch.equal(causal_conv1d(x, w, halo, cu_seqlens=[0, 12]), causal_conv1d(x, w, halo))


def test_document_positions() -> None:
    assert document_positions([0, 1, 4, 6]).tolist() == [0, 0, 1, 2, 0, 1]


def test_layer_with_cu_seqlens_is_every_document_alone() -> None:
    torch.manual_seed(0)
    config = GatedDeltaNetConfig(
        hidden_size=16, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=4, chunk_size=4, dtype=F64
    )
    layer = GatedDeltaNet(config)
    bounds = [0, 1, 6, 7, 19]
    x = torch.randn(1, bounds[-1], 16, dtype=F64, requires_grad=True)
    y = layer(x, cu_seqlens=torch.tensor(bounds))
    y_ref = torch.cat([layer(x[:, a:b]) for a, b in pairwise(bounds)], dim=1)
    assert_close_scaled(y, y_ref, F64, terms=bounds[-1] * 16)
    g = torch.autograd.grad(weighted_sum(y), [x, *layer.parameters()])
    g_ref = torch.autograd.grad(weighted_sum(y_ref), [x, *layer.parameters()])
    for got, want in zip(g, g_ref, strict=True):
        assert_close_scaled(got, want, F64, terms=bounds[-1] * 16)


BAD = {
    "not from 0": ([1, 4, 8], "must start at 0"),
    "not increasing": ([0, 4, 4, 8], "strictly increasing"),
    "not to T": ([0, 4, 9], "must end at the sequence length T = 8"),
    "one entry": ([0], "n + 1 >= 2 boundaries"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_cu_seqlens_name_the_argument(case) -> None:
    bounds, message = BAD[case]
    x = gdn_inputs(Shape(1, 8, 1, 2, 4, 4), unit_qk=True)
    for op in (chunk_gated_delta_rule, recurrent_gated_delta_rule):
        with pytest.raises(ValueError, match=re.escape(message)):
            op(*x, cu_seqlens=torch.tensor(bounds))


def test_bad_packed_calls_name_the_argument() -> None:
    x = gdn_inputs(Shape(2, 8, 1, 2, 4, 4), unit_qk=True)
    with pytest.raises(ValueError, match=r"the batch must be one packed sequence \(B = 1\), got B = 2"):
        chunk_gated_delta_rule(*x, cu_seqlens=torch.tensor([0, 4, 8]))
    one = gdn_inputs(Shape(1, 8, 1, 2, 4, 4), unit_qk=True)
    with pytest.raises(
        ValueError, match=r"initial_state must be \[n, Hv, K, V\] \(one per document\) = \[2, 2, 4, 4\]"
    ):
        chunk_gated_delta_rule(
            *one, initial_state=torch.zeros(1, 2, 4, 4, dtype=F64), cu_seqlens=torch.tensor([0, 4, 8])
        )
    with pytest.raises(ValueError, match="1-D integer tensor"):
        chunk_gated_delta_rule(*one, cu_seqlens=torch.tensor([0.0, 8.0]))
