"""Argument checks: every GDN op refuses a wrong shape with a ValueError that names the argument, and the
chunked ops refuse a chunk_size that is not a positive integer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import GDNInputs, Shape, gdn_inputs, random_state

from gdn_cp.ops import chunk_gated_delta_rule, prepare_chunks, recurrent_gated_delta_rule
from gdn_cp.ops.inputs import check_gdn_inputs

SHAPE = Shape(1, 6, 2, 4, 8, 4)
OPS = [
    pytest.param(check_gdn_inputs, id="check_gdn_inputs"),
    pytest.param(chunk_gated_delta_rule, id="chunk"),
    pytest.param(recurrent_gated_delta_rule, id="recurrent"),
]


def _replace(x: GDNInputs, **changes: torch.Tensor) -> GDNInputs:
    return x._replace(**changes)


# (id, how to break good inputs, a regex the message must match: it names the offending argument)
BAD_INPUTS: list[tuple[str, Callable[[GDNInputs], GDNInputs], str]] = [
    ("q_3d", lambda x: _replace(x, q=x.q[0]), r"q, k, v must be 4-D.*got q \(6, 2, 8\)"),
    ("q_k_mismatch", lambda x: _replace(x, k=x.k[..., :4]), r"^q .* and k .* must have the same shape"),
    ("v_wrong_length", lambda x: _replace(x, v=x.v[:, :5]), r"^v \(1, 5, 4, 4\) must start with \[B, T\]"),
    (
        "hv_not_multiple_of_hk",
        lambda x: _replace(x, v=x.v[:, :, :3]),
        r"^v has 3 heads, which is not a multiple of the 2",
    ),
    ("g_wrong_heads", lambda x: _replace(x, g=x.g[..., :2]), r"^g must be \[B, T, Hv\]"),
    ("g_missing_batch", lambda x: _replace(x, g=x.g[0]), r"^g must be \[B, T, Hv\]"),
    ("beta_wrong_length", lambda x: _replace(x, beta=x.beta[:, :5]), r"^beta must be \[B, T, Hv\]"),
    (
        "mixed_fp32_fp64",
        lambda x: _replace(x, v=x.v.to(torch.float32 if x.q.dtype == torch.float64 else torch.float64)),
        r"^q, k, v must share one dtype .*got q torch.float\d+, k torch.float\d+, v torch.float\d+",
    ),
    (
        "integer_q",
        lambda x: _replace(x, q=x.q.long()),
        r"^q must be a floating-point tensor, got torch.int64",
    ),
    (
        "integer_g",
        lambda x: _replace(x, g=x.g.long()),
        r"^g must be a floating-point tensor, got torch.int64",
    ),
    (
        "bool_beta",
        lambda x: _replace(x, beta=x.beta > 0),
        r"^beta must be a floating-point tensor, got torch.bool",
    ),
    ("meta_v", lambda x: _replace(x, v=x.v.to("meta")), r"^every input must be on one device; got .*v meta"),
]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("break_inputs, word", [pytest.param(f, w, id=i) for i, f, w in BAD_INPUTS])
def test_bad_shapes_raise_naming_argument(op: Callable[..., Any], break_inputs: Callable, word: str) -> None:
    x = break_inputs(gdn_inputs(SHAPE))
    with pytest.raises(ValueError, match=word):
        op(*x)


@pytest.mark.parametrize("op", OPS)
def test_bad_initial_state_raises(op: Callable[..., Any]) -> None:
    x = gdn_inputs(SHAPE)
    h0 = random_state(SHAPE)[..., :3]  # V - 1
    with pytest.raises(ValueError, match=r"^initial_state must be \[B, Hv, K, V\]"):
        op(*x, initial_state=h0)


def test_good_inputs_pass() -> None:
    x = gdn_inputs(SHAPE)
    check_gdn_inputs(*x, initial_state=random_state(SHAPE))


@pytest.mark.parametrize(
    "chunk_size",
    [
        pytest.param(0, id="zero"),
        pytest.param(-4, id="negative"),
        pytest.param(16.0, id="float"),
        pytest.param("16", id="str"),
        # bool is an int subclass, but True is no chunk size (the layer config refuses it too).
        pytest.param(True, id="bool"),
    ],
)
@pytest.mark.parametrize("op", [chunk_gated_delta_rule, prepare_chunks], ids=["chunk", "prepare_chunks"])
def test_bad_chunk_size_raises(op: Callable[..., Any], chunk_size: object) -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        op(*gdn_inputs(SHAPE), chunk_size=chunk_size)
