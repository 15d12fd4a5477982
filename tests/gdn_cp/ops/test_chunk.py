"""chunk_gated_delta_rule == recurrent_gated_delta_rule (the token-by-token reference): outputs, final
states and dtypes, in fp64 (tight), fp32 and bf16, over shapes that stress the chunking (T not a multiple of
the chunk size, T < chunk size, T == 1) and the head grouping (Hv == Hk, Hv = 2 Hk, Hv = 4 Hk)."""

from __future__ import annotations

import pytest
import torch
from helpers import GDNInputs, Shape, assert_close_scaled, gdn_inputs, random_state

from gdn_cp.ops import chunk_gated_delta_rule, chunk_outputs, prepare_chunks, recurrent_gated_delta_rule

# (shape, chunk_size): each case stresses one thing, named in its comment.
CASES = [
    (Shape(1, 64, 2, 4, 16, 8), 16),  # T a multiple of C, Hv = 2 Hk
    (Shape(2, 37, 2, 4, 16, 8), 16),  # ragged tail chunk, batch > 1
    (Shape(1, 5, 1, 4, 8, 8), 16),  # T < C, Hv = 4 Hk
    (Shape(2, 1, 2, 2, 8, 4), 16),  # a single token, Hv == Hk
    (Shape(1, 50, 3, 3, 8, 16), 8),  # Hv == Hk, V > K
    (Shape(1, 70, 1, 2, 16, 8), 64),  # the default chunk size, one full chunk and a tail
]
CASE_PARAMS = [pytest.param(s, c, id=f"{s.id}-C{c}") for s, c in CASES]


def _inputs(shape: Shape, l2norm: bool) -> GDNInputs:
    # Without the in-kernel L2 norm the caller normalises q/k, as a real model does.
    return gdn_inputs(shape, unit_qk=not l2norm)


def _terms(shape: Shape) -> int:
    """Accumulation length of an output or state entry: T tokens, each a K-long dot product."""
    return shape.T * shape.K


def _reference(x: GDNInputs, h0: torch.Tensor | None, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp64 recurrence on the same (upcast) inputs."""
    h0 = None if h0 is None else h0.double()
    o, h = recurrent_gated_delta_rule(*x.to(torch.float64), initial_state=h0, output_final_state=True, **kw)
    return o, h


@pytest.mark.parametrize("shape, chunk_size", CASE_PARAMS)
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "no_l2norm"])
@pytest.mark.parametrize("with_h0", [False, True], ids=["h0_none", "h0"])
def test_fp64_matches_recurrent(shape: Shape, chunk_size: int, l2norm: bool, with_h0: bool) -> None:
    x = _inputs(shape, l2norm)
    h0 = random_state(shape) if with_h0 else None
    kw = {"initial_state": h0, "use_qk_l2norm_in_kernel": l2norm}
    o, h = chunk_gated_delta_rule(*x, output_final_state=True, chunk_size=chunk_size, **kw)
    o_ref, h_ref = recurrent_gated_delta_rule(*x, output_final_state=True, **kw)
    assert_close_scaled(o, o_ref, torch.float64, terms=_terms(shape))
    assert_close_scaled(h, h_ref, torch.float64, terms=_terms(shape))


@pytest.mark.parametrize("shape, chunk_size", CASE_PARAMS)
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "no_l2norm"])
@pytest.mark.parametrize("with_h0", [False, True], ids=["h0_none", "h0"])
def test_fp32_matches_recurrent(shape: Shape, chunk_size: int, l2norm: bool, with_h0: bool) -> None:
    x = _inputs(shape, l2norm).to(torch.float32)
    h0 = random_state(shape, dtype=torch.float32) if with_h0 else None
    kw = {"initial_state": h0, "use_qk_l2norm_in_kernel": l2norm}
    o, h = chunk_gated_delta_rule(*x, output_final_state=True, chunk_size=chunk_size, **kw)
    o_ref, h_ref = recurrent_gated_delta_rule(*x, output_final_state=True, **kw)
    assert o.dtype == h.dtype == torch.float32
    assert_close_scaled(o, o_ref, torch.float32, terms=_terms(shape))
    assert_close_scaled(h, h_ref, torch.float32, terms=_terms(shape))


@pytest.mark.parametrize("shape, chunk_size", CASE_PARAMS)
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "no_l2norm"])
@pytest.mark.parametrize("with_h0", [False, True], ids=["h0_none", "h0"])
def test_bf16_matches_fp64_reference(shape: Shape, chunk_size: int, l2norm: bool, with_h0: bool) -> None:
    x = _inputs(shape, l2norm).to(torch.bfloat16)
    # The state is carried in fp32 between calls, so the initial state comes in fp32.
    h0 = random_state(shape, dtype=torch.float32) if with_h0 else None
    o, h = chunk_gated_delta_rule(
        *x, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=l2norm, chunk_size=chunk_size
    )
    o_ref, h_ref = _reference(x, h0, use_qk_l2norm_in_kernel=l2norm)
    assert o.dtype == torch.bfloat16
    assert h.dtype == torch.float32
    # bf16 rounds the output once (at most eps/2 of the value; factor 1 leaves eps/2 for the fp32 computation
    # before it); the state stays in fp32.
    assert_close_scaled(o, o_ref, torch.bfloat16, factor=1, check_dtype=False)
    assert_close_scaled(h, h_ref, torch.float32, terms=_terms(shape), check_dtype=False)


@pytest.mark.parametrize(
    "dtype, state_dtype",
    [
        pytest.param(torch.float64, torch.float64, id="fp64"),
        pytest.param(torch.float32, torch.float32, id="fp32"),
        pytest.param(torch.bfloat16, torch.float32, id="bf16"),
        pytest.param(torch.float16, torch.float32, id="fp16"),
    ],
)
@pytest.mark.parametrize(
    "op", [chunk_gated_delta_rule, recurrent_gated_delta_rule], ids=["chunk", "recurrent"]
)
def test_dtypes_and_final_state_flag(op: object, dtype: torch.dtype, state_dtype: torch.dtype) -> None:
    shape = Shape(1, 9, 1, 2, 4, 4)
    x = gdn_inputs(shape).to(dtype)
    o, h = op(*x, use_qk_l2norm_in_kernel=True)
    assert o.dtype == dtype and o.shape == x.v.shape
    assert h is None
    _, h = op(*x, use_qk_l2norm_in_kernel=True, output_final_state=True)
    assert h.dtype == state_dtype and h.shape == shape.state


@pytest.mark.parametrize("shape, chunk_size", CASE_PARAMS[:3])
def test_custom_scale(shape: Shape, chunk_size: int) -> None:
    x = gdn_inputs(shape)
    kw = {"scale": 0.3, "use_qk_l2norm_in_kernel": True, "output_final_state": True}
    o, h = chunk_gated_delta_rule(*x, chunk_size=chunk_size, **kw)
    o_ref, h_ref = recurrent_gated_delta_rule(*x, **kw)
    assert_close_scaled(o, o_ref, torch.float64, terms=_terms(shape))
    assert_close_scaled(h, h_ref, torch.float64, terms=_terms(shape))
    # The scale multiplies q only: the output is linear in it and the state does not see it.
    o_default, _ = chunk_gated_delta_rule(*x, chunk_size=chunk_size, use_qk_l2norm_in_kernel=True)
    assert_close_scaled(o, o_default * 0.3 * shape.K**0.5, torch.float64, terms=_terms(shape))


def test_chunk_outputs_continues_from_initial_state() -> None:
    """prepare_chunks once, then chunk_outputs for two entering states: each equals the reference."""
    shape = Shape(2, 23, 2, 4, 8, 4)
    x = gdn_inputs(shape)
    chunks = prepare_chunks(*x, use_qk_l2norm_in_kernel=True, chunk_size=8)
    assert chunks.num_chunks == 3 and chunks.seq_len == 23
    for seed in (1, 2):
        h0 = random_state(shape, seed=seed)
        o, h = chunk_outputs(chunks, h0, output_final_state=True)
        o_ref, h_ref = recurrent_gated_delta_rule(
            *x, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True
        )
        assert_close_scaled(o, o_ref, torch.float64, terms=_terms(shape))
        assert_close_scaled(h, h_ref, torch.float64, terms=_terms(shape))


def test_empty_sequence_passes_the_state_through() -> None:
    shape = Shape(1, 0, 1, 2, 4, 3)
    x = gdn_inputs(shape)
    h0 = random_state(Shape(1, 0, 1, 2, 4, 3))
    o, h = chunk_gated_delta_rule(*x, initial_state=h0, output_final_state=True, chunk_size=4)
    assert o.shape == (1, 0, 2, 3)
    torch.testing.assert_close(h, h0, atol=0, rtol=0)


def test_strong_decay_stays_finite() -> None:
    """g down to ~ -66 per token (A = 16, Qwen3.5's upper A_log bound, times softplus ~ 4): the chunked form
    never forms exp(-gamma), so in-chunk cumulative decays of thousands underflow to zero, never overflow."""
    shape = Shape(1, 100, 2, 4, 16, 8)
    x = gdn_inputs(shape, dtype=torch.float32)
    x = x._replace(g=x.g * 20)
    kw = {"output_final_state": True, "use_qk_l2norm_in_kernel": True}
    o, h = chunk_gated_delta_rule(*x, chunk_size=64, **kw)
    o_ref, h_ref = recurrent_gated_delta_rule(*x, **kw)
    assert torch.isfinite(o).all() and torch.isfinite(h).all()
    assert_close_scaled(o, o_ref, torch.float32, terms=_terms(shape))
    assert_close_scaled(h, h_ref, torch.float32, terms=_terms(shape))
