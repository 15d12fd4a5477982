"""Causal depthwise Conv1D with SiLU that can continue from tokens held elsewhere (the halo)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    halo: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Depthwise causal convolution over the sequence, for the local tokens only.

    Token t sees tokens t-W+1 .. t. The W-1 tokens before the first local one come from `halo` (the end of
    the previous shard, pre-convolution); missing ones are zeros, as at the start of a sequence. With
    halo=None this is exactly the single-device causal convolution.

    Args:
        x: [B, T, D] local tokens, before the convolution
        weight: [D, W] or [D, 1, W] (nn.Conv1d layout) depthwise kernel
        halo: [B, h, D] with h <= W-1, the tokens immediately before x (oldest first), or None
        activation: "silu" or None
    Returns:
        [B, T, D] in x's dtype.
    """
    if weight.dim() == 3:
        weight = weight.squeeze(1)
    D, W = weight.shape
    if x.shape[-1] != D:
        raise ValueError(f"causal_conv1d: x has {x.shape[-1]} channels but weight has {D}")
    if activation not in ("silu", None):
        raise ValueError(f"causal_conv1d: activation must be 'silu' or None, got {activation!r}")
    left = W - 1
    if halo is not None:
        if halo.shape[1] > left:
            raise ValueError(f"causal_conv1d: halo has {halo.shape[1]} tokens, at most W-1 = {left} are used")
        x_ext = torch.cat([halo.to(x.dtype), x], dim=1)
        left -= halo.shape[1]
    else:
        x_ext = x
    # [B, D, T] for conv1d; the remaining left context is zero padding, as at a sequence start.
    xc = F.pad(x_ext.transpose(1, 2).to(weight.dtype), (left, 0))
    out = F.conv1d(xc, weight.unsqueeze(1), groups=D)
    if activation == "silu":
        out = F.silu(out)
    return out.transpose(1, 2).to(x.dtype)
