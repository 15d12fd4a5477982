"""The seam checks what a backend's op returned (issue 50): a user op one token short, of another dtype, on
another device, with a final state of the wrong shape, or not a pair fails right after the call with one
ValueError naming the backend, the tensor and what was expected, not later in a rank with "The size of
tensor a (127) must match the size of tensor b (128)"."""

from __future__ import annotations

import pytest
import torch
from helpers import Shape, gdn_inputs, random_state

from gdn_cp.ops import get_backend, recurrent_gated_delta_rule, register_backend, unregister_backend

SHAPE = Shape(B=1, T=32, Hk=2, Hv=4, K=8, V=8)


def _reference(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
    return recurrent_gated_delta_rule(
        q, k, v, g, beta, scale, initial_state, output_final_state, kw["use_qk_l2norm_in_kernel"]
    )


def _short(*args, **kw):
    o, final = _reference(*args, **kw)
    return o[:, :-1], final


def _in_fp64(*args, **kw):
    o, final = _reference(*args, **kw)
    return o.double(), final


def _elsewhere(*args, **kw):
    o, final = _reference(*args, **kw)
    return o.to("meta"), final


def _state_per_head_missing(*args, **kw):
    o, final = _reference(*args, **kw)
    return o, final[:, :-1]


def _no_state(*args, **kw):
    o, _ = _reference(*args, **kw)
    return o, None


def _output_only(*args, **kw):
    return _reference(*args, **kw)[0]


def _summary_short(q, k, v, g, beta, **kw):
    return get_backend("gdn_cp").summary_op()(q, k, v, g, beta, **kw)[..., :-1]


@pytest.fixture
def registered():
    names = []

    def register(name, op, **kw):
        register_backend(name, op, check=False, grouped_values=True, **kw)
        names.append(name)
        return get_backend(name)

    yield register
    for name in names:
        unregister_backend(name)


@pytest.mark.parametrize(
    ("op", "final", "message"),
    [
        (_short, False, "returned o of shape (1, 31, 4, 8); expected (1, 32, 4, 8) [B, T, Hv, V]"),
        (_in_fp64, False, "returned o in float64; expected float32 (v's)"),
        (_elsewhere, False, "returned o on meta; expected cpu (q's device)"),
        (_state_per_head_missing, True, "returned final_state of shape (1, 3, 8, 8); expected (1, 4, 8, 8)"),
        (_no_state, True, "returned final_state as NoneType; expected a tensor of shape (1, 4, 8, 8)"),
        (_output_only, False, "returned Tensor; expected (o, final_state), a pair"),
    ],
    ids=["one-token-short", "dtype", "device", "final-state-shape", "final-state-missing", "not-a-pair"],
)
def test_what_an_op_returned_is_checked_naming_the_backend_and_the_tensor(registered, op, final, message):
    backend = registered("mine", op)
    x = gdn_inputs(SHAPE, dtype=torch.float32, seed=1)
    with pytest.raises(ValueError) as error:
        backend.rule(*x, output_final_state=final, use_qk_l2norm_in_kernel=True)
    assert str(error.value).startswith(f"backend 'mine' {message}"), str(error.value)


def test_each_document_of_a_per_document_op_is_checked(registered):
    """An op called once per document (varlen=False) is checked per call, with that document's shapes."""
    backend = registered("mine", _short)
    x = [t[:1] for t in gdn_inputs(SHAPE, dtype=torch.float32, seed=2)]
    with pytest.raises(ValueError, match=r"returned o of shape \(1, 9, 4, 8\); expected \(1, 10, 4, 8\)"):
        backend.rule(*x, cu_seqlens=[0, 10, 32], use_qk_l2norm_in_kernel=True)


def test_a_summary_hook_is_checked_as_the_op_is(registered):
    backend = registered("mine", _reference, summary=_summary_short, takes_chunk_size=True)
    x = gdn_inputs(SHAPE, dtype=torch.float32, seed=3)
    with pytest.raises(ValueError) as error:
        backend.summarise(*x, use_qk_l2norm_in_kernel=True, chunk_size=16)
    assert str(error.value) == (
        "backend 'mine''s summary hook returned summary of shape (1, 4, 8, 15); expected (1, 4, 8, 16) "
        "[N, Hv, K, V + K]"
    )


def test_a_correct_op_passes_and_its_final_state_may_be_fp32_beside_bf16():
    """FLA and gdn_cp return fp32 final states for bf16 inputs: only o must be in v's dtype."""
    x = gdn_inputs(SHAPE, dtype=torch.bfloat16, seed=4)
    h0 = random_state(SHAPE).float()
    o, final = get_backend("gdn_cp").rule(*x, initial_state=h0, output_final_state=True, chunk_size=16)
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32
