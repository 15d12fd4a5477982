"""The model FLOPs formula: what it counts, checked against a count of the algorithm's products."""

from __future__ import annotations

import math

import pytest

from gdn_cp.layers import GatedDeltaNetConfig
from gdn_cp.ops import chunk_gdn_flops


def _products(B: int, T: int, Hk: int, Hv: int, K: int, V: int, C: int) -> float:
    """The chunked forward's matrix products listed one by one (m x n @ n x p = 2 m n p), plus the inverse."""

    def mm(m: int, n: int, p: int) -> int:
        return 2 * m * n * p

    per_key_head = mm(C, K, C) + mm(C, K, C)  # Q K^T, K K^T
    per_value_head = (
        C**3 / 3  # (I + L)^-1
        + mm(C, C, K)  # W
        + mm(C, C, V)  # U
        + mm(C, K, V)  # W H
        + mm(K, C, V)  # Kt^T v_new
        + mm(C, K, V)  # Qg H
        + mm(C, C, V)  # P v_new
    )
    return B * math.ceil(T / C) * (Hk * per_key_head + Hv * per_value_head)


@pytest.mark.parametrize(
    "shape", [(1, 8192, 4, 8, 64, 64, 64), (2, 100, 2, 2, 16, 32, 16), (1, 1, 1, 3, 8, 8, 4)]
)
def test_forward_matches_the_listed_products_and_backward_is_twice(shape) -> None:
    B, T, Hk, Hv, K, V, C = shape
    kw = {
        "batch": B,
        "seq_len": T,
        "num_k_heads": Hk,
        "num_v_heads": Hv,
        "head_k_dim": K,
        "head_v_dim": V,
        "chunk_size": C,
    }
    forward = chunk_gdn_flops(**kw, backward=False)
    assert forward == pytest.approx(_products(*shape), rel=1e-12, abs=1)
    assert chunk_gdn_flops(**kw, backward=True) == pytest.approx(3 * forward, abs=3)


def test_layer_adds_projections_and_conv() -> None:
    c = GatedDeltaNetConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)
    core = chunk_gdn_flops(
        batch=1,
        seq_len=64,
        num_k_heads=2,
        num_v_heads=4,
        head_k_dim=8,
        head_v_dim=8,
        chunk_size=64,
        backward=False,
    )
    projections = 2 * 64 * 32 * (c.conv_dim + c.value_dim + 8) + 2 * 64 * c.value_dim * 32
    conv = 2 * 64 * c.conv_dim * 4
    assert c.flops(batch=1, seq_len=64, backward=False) == projections + conv + core
    assert c.flops(batch=1, seq_len=64, backward=True) == 3 * (projections + conv + core)
