"""Model FLOPs of the chunked Gated DeltaNet: one documented count, independent of any implementation.

Speed is reported against it ("how close to the machine's limit"), so it counts the work the chunked
algorithm needs, not what a particular implementation happens to do (recomputation, dense products of
triangular matrices, padding): a faster implementation of the same algorithm scores higher.

Per chunk of C tokens and value head (a product of an m x n and an n x p matrix counts 2 m n p):
    Q K^T and K K^T (once per key head, shared by its G = Hv / Hk value heads)   2 * 2 C^2 K / G
    the UT transform, inverting a unit lower-triangular C x C matrix             C^3 / 3
    W = A (beta e^gamma K), U = A (beta V)                                       2 C^2 K + 2 C^2 V
    the state read and update, v_new = U - W H and H' = Kt^T v_new               2 C K V + 2 C K V
    the output, Qg H + P v_new                                                   2 C K V + 2 C^2 V
The forward is the sum over ceil(T / C) chunks, B sequences and Hv value heads; the backward counts twice
the forward (the usual convention: every product has two gradient products), so forward + backward is 3x.
"""

from __future__ import annotations

import math


def chunk_gdn_flops(
    *,
    batch: int,
    seq_len: int,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    chunk_size: int,
    backward: bool,
) -> int:
    """Model FLOPs of chunk_gated_delta_rule on [B, T] tokens (formula in the module docstring)."""
    C, K, V = chunk_size, head_k_dim, head_v_dim
    G = num_v_heads // num_k_heads
    per_chunk = (
        4 * C * C * K / G  # Q K^T, K K^T per key head
        + C**3 / 3  # UT inverse
        + 2 * C * C * (K + V)  # W, U
        + 6 * C * K * V  # state read, update, output read
        + 2 * C * C * V  # intra-chunk output
    )
    forward = per_chunk * math.ceil(seq_len / C) * batch * num_v_heads
    return int(forward * (3 if backward else 1))
