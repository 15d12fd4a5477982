"""Causal depthwise Conv1D with SiLU that can continue from tokens held elsewhere (the halo)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.ops.documents import document_bounds, document_positions


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    halo: torch.Tensor | None = None,
    activation: str | None = "silu",
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
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
        cu_seqlens: [n + 1] boundaries of the documents in x (0 < ... < T, the same in every row): a token
            sees only earlier tokens of its own document; the halo belongs to the first one.
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
    bounds = None if cu_seqlens is None else document_bounds(cu_seqlens, x.shape[1])
    if bounds is None or len(bounds) == 2:
        out = F.conv1d(xc, weight.unsqueeze(1), groups=D)
    else:
        out = _conv_within_documents(xc, weight, bounds, W - 1 - left)
    if activation == "silu":
        out = F.silu(out)
    return out.transpose(1, 2).to(x.dtype)


def _conv_within_documents(
    xc: torch.Tensor, weight: torch.Tensor, bounds: list[int], halo: int
) -> torch.Tensor:
    """The depthwise convolution tap by tap, each tap masked where it would reach before the token's document.

    xc [B, D, W - 1 + T] (left context included), weight [D, W]; `halo` real tokens of context precede the
    first document. Returns [B, D, T].
    """
    weight_dtype = weight.dtype
    W, T = weight.shape[1], xc.shape[-1] - weight.shape[1] + 1
    seen = document_positions(bounds, xc.device)  # earlier tokens of its document each token may see
    seen[: bounds[1]] += halo
    # Accumulated in fp32 (fp64 stays) and rounded once, as F.conv1d does: bf16 taps would round W times.
    acc = accumulation_dtype(xc.dtype)
    xc, weight = xc.to(acc), weight.to(acc)
    out = xc[..., W - 1 :] * weight[:, W - 1, None]
    for back in range(1, W):  # tap W-1-back reads the token `back` steps before
        tap = xc[..., W - 1 - back : W - 1 - back + T] * weight[:, W - 1 - back, None]
        out = out + tap * (seen >= back).to(acc)
    return out.to(weight_dtype)
