"""The recurrent reference against the math written out literally (design.md section 2), and the one
argument order that every GDN op shares."""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers import Shape, assert_close_scaled, gdn_inputs, random_state

from gdn_cp.ops import chunk_gated_delta_rule, recurrent_gated_delta_rule


def _literal(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    h0: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """H_t = exp(g_t) (I - beta_t k_t k_t^T) H_{t-1} + beta_t k_t v_t^T, o_t = H_t^T (scale q_t), one (b, h)
    at a time, with explicit K x K matrices; q/k L2-normalised as FLA does, x / sqrt(|x|^2 + 1e-6)."""
    B, T, Hk, K = q.shape
    Hv = v.shape[2]
    q, k = (x / (x.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() for x in (q, k))
    q = q * scale
    o = torch.zeros_like(v)
    hT = torch.zeros_like(h0)
    eye = torch.eye(K, dtype=q.dtype)
    for b in range(B):
        for h in range(Hv):
            kh = h // (Hv // Hk)  # key head i serves value heads [i*G, (i+1)*G)
            H = h0[b, h]
            for t in range(T):
                kt, bt = k[b, t, kh][:, None], beta[b, t, h]
                H = g[b, t, h].exp() * (eye - bt * kt @ kt.T) @ H + bt * kt @ v[b, t, h][None, :]
                o[b, t, h] = H.T @ q[b, t, kh]
            hT[b, h] = H
    return o, hT


@pytest.mark.parametrize(
    "shape", [pytest.param(s, id=s.id) for s in (Shape(2, 7, 2, 4, 4, 3), Shape(1, 6, 3, 3, 5, 2))]
)
def test_recurrent_matches_literal_math(shape: Shape) -> None:
    x = gdn_inputs(shape)
    h0 = random_state(shape)
    o, h = recurrent_gated_delta_rule(
        *x, scale=0.7, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    o_ref, h_ref = _literal(*x, h0, scale=0.7)
    # Accumulation length: T tokens, each a K-long dot product.
    assert_close_scaled(o, o_ref, torch.float64, terms=shape.T * shape.K)
    assert_close_scaled(h, h_ref, torch.float64, terms=shape.T * shape.K)


def test_ops_share_argument_order() -> None:
    """FLA's naive recurrent op takes (q, k, v, beta, g) but its chunk op (q, k, v, g, beta); ours must not:
    every parameter of the recurrent op appears in the chunk op, at the same position."""
    recurrent = list(inspect.signature(recurrent_gated_delta_rule).parameters)
    chunk = list(inspect.signature(chunk_gated_delta_rule).parameters)
    assert recurrent[:5] == ["q", "k", "v", "g", "beta"]
    assert chunk[: len(recurrent)] == recurrent
