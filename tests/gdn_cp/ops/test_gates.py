"""gdn_gates: g = -exp(A_log) * softplus(a + dt_bias) <= 0 computed in fp32 (fp64 for fp64), beta = sigmoid(b)
in b's dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close_scaled

from gdn_cp.ops import gdn_gates

B, T, HV = 2, 9, 4


@pytest.mark.parametrize(
    "dtype, g_dtype",
    [
        pytest.param(torch.float64, torch.float64, id="fp64"),
        pytest.param(torch.float32, torch.float32, id="fp32"),
        pytest.param(torch.bfloat16, torch.float32, id="bf16"),
    ],
)
def test_matches_formula(dtype: torch.dtype, g_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = (
        (5 * torch.randn(B, T, HV, generator=gen)).to(dtype),
        torch.randn(B, T, HV, generator=gen).to(dtype),
    )
    A_log = torch.empty(HV).uniform_(0.01, 16, generator=gen).log().to(dtype)
    dt_bias = torch.randn(HV, generator=gen).to(dtype)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    assert g.dtype == g_dtype and beta.dtype == dtype
    expected_g = -A_log.to(g_dtype).exp() * F.softplus(a.to(g_dtype) + dt_bias.to(g_dtype))
    # Elementwise exp, softplus and products in g's dtype: a few eps of each value.
    assert_close_scaled(g, expected_g, g_dtype, elementwise=True)
    torch.testing.assert_close(beta, torch.sigmoid(b), atol=0, rtol=0)
    assert (g <= 0).all()


def test_g_nonpositive_at_extremes() -> None:
    a = torch.tensor([[[-100.0, 0.0, 100.0]]])
    g, beta = gdn_gates(a, torch.zeros(1, 1, 3), torch.tensor([-20.0, 0.0, 5.0]), torch.zeros(3))
    assert torch.isfinite(g).all() and (g <= 0).all()
    assert torch.all((beta > 0) & (beta < 1))


def test_fp16_large_a_log_does_not_overflow() -> None:
    """exp(A_log) overflows fp16 above ~11.1; computing g in fp32 keeps it finite, as transformers does."""
    A_log = torch.full((1,), 12.0, dtype=torch.float16)
    g, _ = gdn_gates(torch.zeros(1, 1, 1, dtype=torch.float16), torch.zeros(1, 1, 1, dtype=torch.float16),
                     A_log, torch.zeros(1, dtype=torch.float16))  # fmt: skip
    assert g.dtype == torch.float32 and torch.isfinite(g).all()
