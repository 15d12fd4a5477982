"""split_chunk_outputs: the outputs of prepared chunks split by what they need of the entering states (the CP
modes' overlap) equal chunk_outputs given those states, in value and in every gradient, for one segment,
segments of their own (cu_seqlens), documents sharing chunks (resets) and segments that do not read H_in."""

from __future__ import annotations

import pytest
import torch
from helpers import Shape, assert_close_scaled, gdn_inputs, weighted_sum

from gdn_cp.ops import chunk_outputs, prepare_chunks, split_chunk_outputs

SHAPE = Shape(B=1, T=45, Hk=2, Hv=4, K=5, V=3)
CHUNK = 8
LAYOUTS = {
    "one-segment": {},
    "segments": {"cu_seqlens": [0, 13, 14, 30, 45]},  # a one-token segment too
    "resets": {"cu_seqlens": [0, 20, 45], "resets": [5, 33]},
}


def _states(chunks, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    n = chunks.grid.num_segments
    shape = (SHAPE.B, n, SHAPE.Hv, SHAPE.K, SHAPE.V) if chunks.per_segment else SHAPE.state
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _run(x, layout: dict, split: bool, carried: torch.Tensor | None) -> list[torch.Tensor]:
    """Outputs, final states and the gradients of q, k, v, g, beta and of the entering states."""
    inputs = [t.detach().clone().requires_grad_(True) for t in x]
    chunks = prepare_chunks(*inputs, use_qk_l2norm_in_kernel=True, chunk_size=CHUNK, **layout)
    entering = _states(chunks, 1).requires_grad_(True)
    fresh = _states(chunks, 2) if carried is not None else None
    if split:
        o, final = split_chunk_outputs(chunks, fresh, carried).with_entering_states(entering, True)
    else:
        h = entering if carried is None else torch.where(carried.view(1, -1, 1, 1, 1), entering, fresh)
        o, final = chunk_outputs(chunks, h, True)
    weighted_sum(o, final).backward()
    return [o.detach(), final.detach(), *(t.grad for t in inputs), entering.grad]


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_split_equals_the_plain_outputs(layout: str) -> None:
    x = gdn_inputs(SHAPE, seed=3)
    for got, want in zip(
        _run(x, LAYOUTS[layout], True, None), _run(x, LAYOUTS[layout], False, None), strict=True
    ):
        # The split sums o = free + q_eff H in another order than the scan: roundoff over T tokens of K terms.
        assert_close_scaled(got, want, torch.float64, terms=SHAPE.T * SHAPE.K)


def test_segments_that_do_not_read_the_entering_state_start_fresh() -> None:
    x = gdn_inputs(SHAPE, seed=4)
    layout = LAYOUTS["segments"]
    carried = torch.tensor([True, False, True, False])
    split, plain = _run(x, layout, True, carried), _run(x, layout, False, carried)
    for got, want in zip(split, plain, strict=True):
        assert_close_scaled(got, want, torch.float64, terms=SHAPE.T * SHAPE.K)
    d_entering = split[-1]
    assert d_entering[:, ~carried].abs().max() == 0  # nothing of theirs reads H_in
    assert d_entering[:, carried].abs().max() > 0


def test_split_outputs_gradcheck() -> None:
    x = gdn_inputs(Shape(B=1, T=11, Hk=1, Hv=2, K=3, V=2), seed=5, requires_grad=True)
    gen = torch.Generator().manual_seed(6)
    h = torch.randn(1, 2, 3, 2, generator=gen, dtype=torch.float64, requires_grad=True)

    def fn(q, k, v, g, beta, h):
        chunks = prepare_chunks(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, chunk_size=4)
        return split_chunk_outputs(chunks).with_entering_states(h, True)

    assert torch.autograd.gradcheck(fn, (*x, h))
