"""Normalisations of the GDN layer: the q/k L2 norm and the gated RMSNorm on the output."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_cp.dtypes import accumulation_dtype


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) along `dim`, as FLA and transformers compute it. Any shape."""
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """RMSNorm of x, times weight, times silu(gate): the Qwen3.5 GDN output norm.

    The rounding follows transformers' `Qwen3_5RMSNormGated` so that a loaded checkpoint gives the same
    output: normalise in fp32 (fp64 for fp64 inputs), cast back, scale by the weight, then gate.

    Args:
        x: [..., V]
        gate: [..., V] (the z projection)
        weight: [V]
    Returns:
        [..., V] in x's dtype.
    """
    dtype, acc = x.dtype, accumulation_dtype(x.dtype)
    xf = x.to(acc)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * xf.to(dtype)
    return (out * F.silu(gate.to(acc))).to(dtype)
