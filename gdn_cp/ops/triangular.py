"""The inverse of a unit lower-triangular matrix, (I + L)^-1 with L strictly lower, from matmuls only.

The UT transform of every chunk needs it (gdn_cp.ops.chunk). A triangular solve runs row by row and is
several times slower than a matmul of the same size on CPU; here the work is batched matmul:
- blocks of at most BASE rows: L is nilpotent (L^n = 0), so (I + L)^-1 = sum_k (-L)^k
  = (I - L)(I + L^2)(I + L^4)..., ceil(log2 n) squarings;
- larger: split into halves, [[A, 0], [C, D]]^-1 = [[A^-1, 0], [-D^-1 C A^-1, D^-1]], recursively (as
  flash-linear-attention's solve_tril merges 16 x 16 blocks).
"""

from __future__ import annotations

import torch

BASE = 16
"""Largest block inverted by the squaring product; larger ones are split in halves."""


def _product_inverse(L: torch.Tensor) -> torch.Tensor:
    n = L.shape[-1]
    eye = torch.eye(n, dtype=L.dtype, device=L.device)
    x = -L
    inv = eye + x
    power = 2
    while power < n:
        x = x @ x
        inv = inv + inv @ x
        power *= 2
    return inv


def unit_lower_inverse(L: torch.Tensor) -> torch.Tensor:
    """(I + L)^-1 for L strictly lower triangular (entries on and above the diagonal are ignored).

    Args:
        L: [..., n, n]
    Returns:
        [..., n, n], unit lower triangular.
    """
    L = L.tril(-1)
    n = L.shape[-1]
    if n <= BASE:
        return _product_inverse(L)
    h = n // 2
    top = unit_lower_inverse(L[..., :h, :h])
    bottom = unit_lower_inverse(L[..., h:, h:])
    lower_left = -(bottom @ L[..., h:, :h] @ top)
    upper = torch.cat([top, L.new_zeros(*L.shape[:-2], h, n - h)], dim=-1)
    return torch.cat([upper, torch.cat([lower_left, bottom], dim=-1)], dim=-2)
