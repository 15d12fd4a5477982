"""Gradients of the chunked GDN: torch.autograd.gradcheck in fp64 on tiny shapes (chunk op, prepared
chunks + chunk_outputs), and gradients of the chunk op == gradients of the recurrent reference."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import Shape, assert_close_scaled, gdn_inputs, random_state, weighted_sum

from gdn_cp.ops import chunk_gated_delta_rule, chunk_outputs, prepare_chunks, recurrent_gated_delta_rule
from gdn_cp.ops.chunk import BACKWARD_BLOCK, FORWARD_BLOCK

# Two chunks and a ragged tail (T=10, C=4) and grouped value heads, small enough for numerical Jacobians.
TINY = Shape(1, 10, 1, 2, 3, 2)


@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "no_l2norm"])
def test_gradcheck_chunk_gated_delta_rule(l2norm: bool) -> None:
    x = gdn_inputs(TINY, unit_qk=not l2norm, requires_grad=True)
    h0 = random_state(TINY).requires_grad_()

    def fn(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        *qkvgb, h0 = args
        kw = {"use_qk_l2norm_in_kernel": l2norm, "chunk_size": 4}
        return chunk_gated_delta_rule(*qkvgb, initial_state=h0, output_final_state=True, **kw)

    assert torch.autograd.gradcheck(fn, (*x, h0))


def test_gradcheck_chunk_outputs_with_initial_state() -> None:
    x = gdn_inputs(TINY, requires_grad=True)
    h0 = random_state(TINY).requires_grad_()

    def fn(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        *qkvgb, h0 = args
        chunks = prepare_chunks(*qkvgb, use_qk_l2norm_in_kernel=True, chunk_size=4)
        return chunk_outputs(chunks, h0, output_final_state=True)

    assert torch.autograd.gradcheck(fn, (*x, h0))


# C=16: 3 chunks in one block of the fused op; C=2: 19 chunks, two forward blocks and several backward blocks
# with ragged last ones, so the block-entering states and the block-wise gradients are exercised too.
@pytest.mark.parametrize("chunk_size", [16, 2], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("with_h0", [False, True], ids=["h0_none", "h0"])
def test_gradients_match_recurrent(with_h0: bool, chunk_size: int) -> None:
    assert math.ceil(37 / 2) > max(2 * BACKWARD_BLOCK, FORWARD_BLOCK)
    shape = Shape(2, 37, 2, 4, 8, 4)
    x = gdn_inputs(shape, requires_grad=True)
    h0 = random_state(shape).requires_grad_() if with_h0 else None
    wrt = (*x, h0) if with_h0 else tuple(x)
    kw = {"initial_state": h0, "output_final_state": True, "use_qk_l2norm_in_kernel": True}

    o, h = chunk_gated_delta_rule(*x, chunk_size=chunk_size, **kw)
    got = torch.autograd.grad(weighted_sum(o, h), wrt)
    o, h = recurrent_gated_delta_rule(*x, **kw)
    want = torch.autograd.grad(weighted_sum(o, h), wrt)

    for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), got, want, strict=False):
        # Every gradient entry sums over the T tokens of the sequence and the K x V entries of the state.
        terms = shape.T * shape.K * shape.V
        assert_close_scaled(a, b, torch.float64, terms=terms, msg=f"d{name}:")
