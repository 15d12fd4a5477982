"""The matmul-only unit lower-triangular inverse of the UT transform."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close_scaled

from gdn_cp.ops.triangular import BASE, unit_lower_inverse


@pytest.mark.parametrize("n", [1, 2, 3, BASE - 1, BASE, BASE + 1, 2 * BASE, 3 * BASE, 64, 100])
def test_inverse_of_unit_lower_triangular(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    L = 0.3 * torch.randn(2, 3, n, n, generator=gen, dtype=torch.float64)
    A = unit_lower_inverse(L)
    eye = torch.eye(n, dtype=torch.float64)
    assert_close_scaled(A @ (eye + L.tril(-1)), eye.expand(2, 3, n, n), torch.float64, terms=n * n)
    assert torch.equal(A.triu(1), torch.zeros_like(A)) and torch.equal(
        A.diagonal(dim1=-2, dim2=-1), torch.ones(2, 3, n, dtype=torch.float64)
    )


def test_entries_on_and_above_the_diagonal_are_ignored() -> None:
    L = torch.randn(4, 20, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(unit_lower_inverse(L), unit_lower_inverse(L.tril(-1)))


def test_matches_a_triangular_solve_in_fp32() -> None:
    gen = torch.Generator().manual_seed(1)
    L = (0.1 * torch.randn(8, 64, 64, generator=gen)).tril(-1)
    eye = torch.eye(64)
    want = torch.linalg.solve_triangular(eye + L, eye.expand(8, 64, 64), upper=False, unitriangular=True)
    assert_close_scaled(unit_lower_inverse(L), want, torch.float32, terms=64 * 64)
