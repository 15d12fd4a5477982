"""The per-token gates of the Qwen3.5 GDN layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_cp.dtypes import accumulation_dtype


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-decay g = -exp(A_log) * softplus(a + dt_bias) and write strength beta = sigmoid(b).

    g is computed in fp32 (fp64 for fp64 inputs), as transformers does, so exp(A_log) cannot overflow in fp16.

    Args:
        a: [B, T, Hv] the `in_proj_a` projection
        b: [B, T, Hv] the `in_proj_b` projection
        A_log: [Hv]
        dt_bias: [Hv]
    Returns:
        g [B, T, Hv] in the accumulation dtype (<= 0), beta [B, T, Hv] in b's dtype.
    """
    acc = accumulation_dtype(a.dtype)
    g = -A_log.to(acc).exp() * F.softplus(a.to(acc) + dt_bias)
    return g, b.sigmoid()
