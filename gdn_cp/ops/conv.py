"""Causal depthwise Conv1D with SiLU that can continue from tokens held elsewhere (the halo)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
import torch.nn.functional as F

from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.ops.documents import document_bounds


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
    if halo is not None and halo.shape[1] > W - 1:
        raise ValueError(f"causal_conv1d: halo has {halo.shape[1]} tokens, at most W-1 = {W - 1} are used")
    x_ext = x if halo is None else torch.cat([halo.to(x.dtype), x], dim=1)
    left = W - 1 - (0 if halo is None else halo.shape[1])
    bounds = None if cu_seqlens is None else document_bounds(cu_seqlens, x.shape[1])
    packed = bounds is not None and len(bounds) > 2
    # Packed: the correction below is exact only before rounding, so bf16 convolves in fp32 and rounds once
    # (what bf16 conv1d does inside).
    dtype = accumulation_dtype(weight.dtype) if packed else weight.dtype
    # [B, D, T] for conv1d; the remaining left context is zero padding, as at a sequence start.
    xc = F.pad(x_ext.transpose(1, 2).to(dtype), (left, 0))
    out = F.conv1d(xc, weight.to(dtype).unsqueeze(1), groups=D)
    if packed:
        out = _drop_cross_document_taps(out, xc, weight.to(dtype), bounds).to(weight.dtype)
    if activation == "silu":
        out = F.silu(out)
    return out.transpose(1, 2).to(x.dtype)


def _drop_cross_document_taps(
    out: torch.Tensor, xc: torch.Tensor, weight: torch.Tensor, bounds: list[int]
) -> torch.Tensor:
    """The convolution `out` [B, D, T] of the whole sequence `xc` [B, D, W - 1 + T] (left context
    included), less every tap that reaches before its token's document: only the first W - 1 tokens of each
    document after the first have such taps, (n - 1)(W - 1) positions in all, so this touches those alone."""
    W = weight.shape[1]
    device = out.device
    # Token t = s + i of a document starting at s (i < W - 1) reads xc[t + j] through tap j; taps with
    # j < W - 1 - i reach before s.
    hits = [(s + i, i) for s, end in pairwise(bounds[1:]) for i in range(min(W - 1, end - s))]
    at = torch.tensor([t for t, _ in hits], device=device)
    inside = torch.tensor([i for _, i in hits], device=device)
    taps = torch.arange(W, device=device)
    window = xc[:, :, at[:, None] + taps]  # [B, D, m, W]
    crossing = (taps[None, :] < W - 1 - inside[:, None]).to(xc.dtype)  # [m, W]
    wrong = (window * weight[:, None, :] * crossing).sum(-1)  # [B, D, m]
    # In place: conv1d's backward reads its inputs, not its output.
    out[:, :, at] -= wrong
    return out


def conv_state(
    x: torch.Tensor,
    width: int,
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
    *,
    positions: torch.Tensor | None = None,
    seq_len: int | None = None,
) -> torch.Tensor:
    """The Conv1D's state after the sequence: the last `width` tokens before the convolution, what decoding
    continues from (transformers' `conv_states` layout: a decode step convolves them with the new token).

    Under CP each rank passes the tokens it holds and their global `positions`: a slot whose token is on
    another rank is zero here, so the ranks' results sum to the whole sequence's state.

    Args:
        x: [B, L, D] tokens before the convolution (this rank's, in increasing global position)
        width: tokens kept, the kernel size W
        cu_seqlens: [n + 1] global boundaries of the documents packed in a batch of one (B = 1), or None
        positions: [L] global position of each of x's tokens, increasing (default 0 .. L - 1)
        seq_len: global tokens T (default L; with cu_seqlens, its last entry)
    Returns:
        [N, D, W] in x's dtype, N = B (or n documents): slot W - 1 the last token of the sequence (document),
        slots before its first token zeros, as transformers pads a prompt shorter than W.
    """
    B, L, D = x.shape
    device = x.device
    positions = torch.arange(L, device=device) if positions is None else positions.to(device)
    if seq_len is None:
        seq_len = int(cu_seqlens[-1]) if cu_seqlens is not None else L
    bounds = [0, seq_len] if cu_seqlens is None else document_bounds(cu_seqlens, seq_len)
    if L == 0:
        return x.new_zeros(len(bounds) - 1 if cu_seqlens is not None else B, D, width)
    starts = torch.tensor(bounds[:-1], device=device)
    ends = torch.tensor(bounds[1:], device=device)
    wanted = ends[:, None] - width + torch.arange(width, device=device)  # [n, W] global positions
    at = torch.searchsorted(positions, wanted).clamp(max=L - 1)
    held = (wanted >= starts[:, None]) & (positions[at] == wanted)
    window = torch.where(held[None, :, :, None], x[:, at], 0)  # [B, n, W, D]
    state = window[0] if cu_seqlens is not None else window[:, 0]  # [N, W, D]
    return state.transpose(1, 2).contiguous()
