"""Property: a sequence cut anywhere (empty pieces included) and run piece by piece, each piece's final state
entering the next as initial_state, gives the whole sequence's outputs and final state, for any chunk size."""

from __future__ import annotations

from itertools import pairwise

import torch
from helpers import Shape, assert_close_scaled, gdn_inputs, random_state
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_cp.ops import chunk_gated_delta_rule

# (B, Hk, Hv, K, V): grouped and ungrouped value heads.
HEADS = [(2, 1, 2, 4, 3), (1, 2, 2, 3, 5)]


@st.composite
def split_sequences(draw: st.DrawFn) -> tuple[Shape, list[int], int, int]:
    """(shape, piece boundaries [0, ..., T], chunk size, seed). Repeated cuts make empty pieces."""
    B, Hk, Hv, K, V = draw(st.sampled_from(HEADS))
    T = draw(st.integers(1, 40))
    cuts = draw(st.lists(st.integers(0, T), max_size=4))
    chunk_size = draw(st.sampled_from([1, 3, 4, 8, 16, 64]))
    return Shape(B, T, Hk, Hv, K, V), [0, *sorted(cuts), T], chunk_size, draw(st.integers(0, 2**16))


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(case=split_sequences(), with_h0=st.booleans())
def test_pieces_chained_by_state_equal_whole_sequence(
    case: tuple[Shape, list[int], int, int], with_h0: bool
) -> None:
    shape, bounds, chunk_size, seed = case
    x = gdn_inputs(shape, seed=seed)
    h0 = random_state(shape, seed=seed + 1) if with_h0 else None
    kw = {"output_final_state": True, "use_qk_l2norm_in_kernel": True, "chunk_size": chunk_size}
    o_whole, h_whole = chunk_gated_delta_rule(*x, initial_state=h0, **kw)

    h, outputs = h0, []
    for start, stop in pairwise(bounds):
        o, h = chunk_gated_delta_rule(*x.slice(start, stop), initial_state=h, **kw)
        outputs.append(o)
    # Accumulation length: T tokens, each a K-long dot product.
    assert_close_scaled(torch.cat(outputs, dim=1), o_whole, torch.float64, terms=shape.T * shape.K)
    assert_close_scaled(h, h_whole, torch.float64, terms=shape.T * shape.K)
