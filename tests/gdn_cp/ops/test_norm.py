"""gated_rms_norm against transformers' Qwen3_5RMSNormGated (bit-exact: checkpoints must give the same
output), and l2norm against its formula."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close_scaled
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

from gdn_cp.ops import gated_rms_norm, l2norm

V = 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gated_rms_norm_matches_transformers(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(2, 7, 4, V, generator=gen)).to(dtype)
    gate = torch.randn(2, 7, 4, V, generator=gen).to(dtype)
    ref = Qwen3_5RMSNormGated(V, eps=1e-6).to(dtype)
    with torch.no_grad():
        ref.weight.copy_(1 + 0.5 * torch.randn(V, generator=gen))
    out = gated_rms_norm(x, gate, ref.weight, eps=1e-6)
    assert out.dtype == dtype
    # transformers applies it to [N, V] rows; the norm is per row, so any leading shape must agree.
    torch.testing.assert_close(
        out, ref(x.reshape(-1, V), gate.reshape(-1, V)).reshape(x.shape), atol=0, rtol=0
    )


def test_gated_rms_norm_formula_fp64() -> None:
    gen = torch.Generator().manual_seed(1)
    x, gate, w = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((5, V), (5, V), (V,)))
    expected = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w * gate * torch.sigmoid(gate)
    # The mean of V squares, then elementwise ops: each output's relative error stays within a few eps.
    out = gated_rms_norm(x, gate, w, eps=1e-5)
    assert_close_scaled(out, expected, torch.float64, terms=V, elementwise=True)


@pytest.mark.parametrize("dim", [-1, 1], ids=["last_dim", "dim1"])
def test_l2norm_formula(dim: int) -> None:
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    expected = x / (x.pow(2).sum(dim, keepdim=True) + 1e-6).sqrt()
    assert_close_scaled(l2norm(x, dim=dim), expected, torch.float64, terms=x.shape[dim], elementwise=True)
    # eps keeps a zero vector finite.
    assert torch.equal(l2norm(torch.zeros(4)), torch.zeros(4))
