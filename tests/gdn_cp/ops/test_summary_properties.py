"""Properties of affine state summaries: a summary maps any entering state to the chunk op's final state, and
per-piece summaries composed in any grouping (left fold, right fold, random tree) or folded into a state give
the whole sequence's summary and final state, whatever the chunk sizes."""

from __future__ import annotations

from functools import reduce
from itertools import pairwise

import torch
from helpers import GDNInputs, Shape, assert_close_scaled, gdn_inputs, random_state
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_cp.ops import (
    apply_summary,
    chunk_gated_delta_rule,
    compose_summaries,
    fold_summaries,
    gdn_state_summary,
    prepare_chunks,
)
from gdn_cp.ops.summary import Summary

HEADS = [(2, 1, 2, 4, 3), (1, 2, 2, 3, 5)]  # (B, Hk, Hv, K, V)
CHUNK_SIZES = [1, 3, 4, 8, 16]
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


def _summary(x: GDNInputs, chunk_size: int, checkpoint_summary: bool = False) -> Summary:
    chunks = prepare_chunks(*x, use_qk_l2norm_in_kernel=True, chunk_size=chunk_size)
    return gdn_state_summary(chunks, checkpoint_summary=checkpoint_summary)


def _terms(shape: Shape) -> int:
    """Accumulation length of a summary or state entry: T tokens, each a K-long dot product."""
    return shape.T * shape.K


def _assert_summaries_close(actual: Summary, expected: Summary, shape: Shape) -> None:
    assert_close_scaled(actual[0], expected[0], torch.float64, terms=_terms(shape), msg="S:")
    assert_close_scaled(actual[1], expected[1], torch.float64, terms=_terms(shape), msg="M:")


@st.composite
def shapes(draw: st.DrawFn, min_T: int = 0) -> Shape:
    B, Hk, Hv, K, V = draw(st.sampled_from(HEADS))
    return Shape(B, draw(st.integers(min_T, 40)), Hk, Hv, K, V)


@SETTINGS
@given(
    shape=shapes(),
    chunk_size=st.sampled_from(CHUNK_SIZES),
    checkpoint_summary=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_apply_summary_equals_final_state(
    shape: Shape, chunk_size: int, checkpoint_summary: bool, seed: int
) -> None:
    x = gdn_inputs(shape, seed=seed)
    H = random_state(shape, seed=seed + 1)
    summary = _summary(x, chunk_size, checkpoint_summary)
    _, h = chunk_gated_delta_rule(
        *x, initial_state=H, output_final_state=True, use_qk_l2norm_in_kernel=True, chunk_size=chunk_size
    )
    assert_close_scaled(apply_summary(summary, H), h, torch.float64, terms=_terms(shape))


def _random_tree(data: st.DataObject, pieces: list[Summary]) -> Summary:
    """Compose the pieces, in order, under a random bracketing."""
    if len(pieces) == 1:
        return pieces[0]
    cut = data.draw(st.integers(1, len(pieces) - 1))
    return compose_summaries(_random_tree(data, pieces[:cut]), _random_tree(data, pieces[cut:]))


@SETTINGS
@given(shape=shapes(min_T=1), data=st.data())
def test_piece_summaries_compose_to_whole(shape: Shape, data: st.DataObject) -> None:
    x = gdn_inputs(shape, seed=data.draw(st.integers(0, 2**16)))
    cuts = data.draw(st.lists(st.integers(0, shape.T), min_size=1, max_size=4))
    bounds = [0, *sorted(cuts), shape.T]
    # Each piece picks its own chunk size: a summary must not depend on how a piece was chunked.
    pieces = [_summary(x.slice(a, b), data.draw(st.sampled_from(CHUNK_SIZES))) for a, b in pairwise(bounds)]
    whole = _summary(x, data.draw(st.sampled_from(CHUNK_SIZES)))

    _assert_summaries_close(reduce(compose_summaries, pieces), whole, shape)
    _assert_summaries_close(reduce(lambda acc, s: compose_summaries(s, acc), reversed(pieces)), whole, shape)
    _assert_summaries_close(_random_tree(data, pieces), whole, shape)

    _, h_zero = chunk_gated_delta_rule(*x, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_close_scaled(fold_summaries(pieces), h_zero, torch.float64, terms=_terms(shape))
    H = random_state(shape)
    _, h_from_H = chunk_gated_delta_rule(
        *x, initial_state=H, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    assert_close_scaled(fold_summaries(pieces, H), h_from_H, torch.float64, terms=_terms(shape))
