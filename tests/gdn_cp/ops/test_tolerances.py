"""The tolerance rule of the tests (helpers.tolerance / assert_close_scaled): rounding noise passes, a real
error fails even at the longest accumulation any test allows, NaN and shape mismatches fail."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close_scaled, tolerance

LONGEST = 10**5
"""More terms than any test passes (the longest today: the benchmarks' gate, about 1.2e4)."""


def _reference() -> torch.Tensor:
    return torch.randn(64, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_bound_follows_dtype_and_terms() -> None:
    eps = torch.finfo(torch.float32).eps
    assert tolerance(torch.float32) == 16 * eps
    assert tolerance(torch.float32, terms=100) == pytest.approx(160 * eps)
    assert tolerance(torch.float64, terms=100) < tolerance(torch.float32, terms=100) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_rounding_to_the_dtype_passes(dtype: torch.dtype) -> None:
    e = _reference()
    assert_close_scaled(e.to(dtype), e, dtype, check_dtype=False)
    assert_close_scaled(e.to(dtype), e, dtype, factor=1, check_dtype=False)  # one rounding: eps/2 at most


def test_a_real_error_fails_at_any_allowed_length() -> None:
    e = _reference().float()
    wrong = e.clone()
    wrong[3, 5] += 1e-3 * e.abs().max()  # 1e-3 of the output's scale in fp32: a bug, not rounding
    assert tolerance(torch.float32, terms=LONGEST) < 1e-3
    with pytest.raises(AssertionError, match=r"relative error 1\.000e-03"):
        assert_close_scaled(wrong, e, torch.float32, terms=LONGEST)


def test_elementwise_sees_errors_in_small_entries() -> None:
    e = _reference().float()
    e[0, 0] = 1e-4 * e.abs().max()
    wrong = e.clone()
    wrong[0, 0] *= 1 + 1e-3  # 1e-3 of that small entry, 1e-7 of the largest: within the normwise bound
    assert_close_scaled(wrong, e, torch.float32)
    with pytest.raises(AssertionError, match="elementwise"):
        assert_close_scaled(wrong, e, torch.float32, elementwise=True)


def test_nan_shape_and_dtype_mismatches_fail() -> None:
    e = _reference()
    nan = e.clone()
    nan[1, 1] = float("nan")
    with pytest.raises(AssertionError):
        assert_close_scaled(nan, e, torch.float64)
    with pytest.raises(AssertionError, match="shape"):
        assert_close_scaled(e[:, :-1], e[:, 1:].T, torch.float64)
    with pytest.raises(AssertionError, match="dtype"):
        assert_close_scaled(e.float(), e, torch.float32)
