"""causal_conv1d: equals torch's depthwise nn.Conv1d (+ SiLU) on the full sequence, and a sequence cut into
shards, each given the pre-convolution tokens before it as `halo`, reproduces the full output; conv_state
keeps the tokens decoding continues from."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close_scaled
from torch import nn

from gdn_cp.ops import causal_conv1d, conv_state

B, T, D, W = 2, 23, 6, 4


def _inputs(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, nn.Conv1d]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64).to(dtype)
    conv = nn.Conv1d(D, D, kernel_size=W, groups=D, padding=W - 1, bias=False, dtype=dtype)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(D, 1, W, generator=gen, dtype=torch.float64))
    return x, conv


def _torch_reference(x: torch.Tensor, conv: nn.Conv1d, activation: str | None) -> torch.Tensor:
    out = conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)
    return F.silu(out) if activation == "silu" else out


@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "no_activation"])
@pytest.mark.parametrize("weight_layout", ["D1W", "DW"])
def test_matches_torch_conv1d(activation: str | None, weight_layout: str) -> None:
    x, conv = _inputs()
    weight = conv.weight if weight_layout == "D1W" else conv.weight.squeeze(1)
    out = causal_conv1d(x, weight, activation=activation)
    # Each output is a W-term dot product (the SiLU after it is well conditioned).
    assert_close_scaled(out, _torch_reference(x, conv, activation), torch.float64, terms=W)


@pytest.mark.parametrize(
    "bounds",
    [
        pytest.param([0, 8, 16, 23], id="three_shards"),
        pytest.param([0, 2, 9, 23], id="first_shard_shorter_than_halo"),
        pytest.param(list(range(T + 1)), id="one_token_shards"),
        pytest.param([0, 1, 2, 5, 6, 23], id="mixed"),
    ],
)
def test_shards_with_halo_reproduce_full_output(bounds: list[int]) -> None:
    x, conv = _inputs()
    full = causal_conv1d(x, conv.weight)
    pieces = []
    for start, stop in pairwise(bounds):
        # The W-1 tokens before the shard, fewer near the start of the sequence; they may span several
        # earlier shards when shards are shorter than the halo.
        halo = x[:, max(0, start - (W - 1)) : start]
        pieces.append(causal_conv1d(x[:, start:stop], conv.weight, halo=halo))
    assert_close_scaled(torch.cat(pieces, dim=1), full, torch.float64, terms=W)


def test_halo_carries_gradients() -> None:
    """In CP the halo arrives through a differentiable collective: its gradient must reach the tokens it
    came from, so sharded gradients of x and the weight sum to the full-sequence ones."""
    x, conv = _inputs()
    x.requires_grad_()
    r = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = torch.autograd.grad((causal_conv1d(x, conv.weight) * r).sum(), (x, conv.weight))
    bounds = [0, 2, 9, 23]
    loss = sum(
        (causal_conv1d(x[:, a:b], conv.weight, halo=x[:, max(0, a - W + 1) : a]) * r[:, a:b]).sum()
        for a, b in pairwise(bounds)
    )
    got = torch.autograd.grad(loss, (x, conv.weight))
    for name, a, b in zip(("x", "weight"), got, want, strict=True):
        # The weight's gradient sums over every (batch, token): the longest accumulation here.
        assert_close_scaled(a, b, torch.float64, terms=B * T, msg=f"d{name}:")


def test_empty_halo_equals_no_halo() -> None:
    x, conv = _inputs()
    assert torch.equal(causal_conv1d(x, conv.weight, halo=x[:, :0]), causal_conv1d(x, conv.weight))


def test_bf16_output_dtype_and_accuracy() -> None:
    x, conv = _inputs()
    out = causal_conv1d(x.bfloat16(), conv.weight.bfloat16())
    assert out.dtype == torch.bfloat16
    # Against the fp64 result on unrounded inputs: x and the weight are rounded to bf16 (eps/2 each, so up to
    # eps per product, adding up over the W products) and the output once more (eps/2).
    assert_close_scaled(
        out, _torch_reference(x, conv, "silu"), torch.bfloat16, terms=W, factor=2, check_dtype=False
    )


def test_rejects_halo_longer_than_kernel() -> None:
    x, conv = _inputs()
    with pytest.raises(ValueError, match="halo"):
        causal_conv1d(x, conv.weight, halo=torch.zeros(B, W, D, dtype=x.dtype))


def test_rejects_wrong_channel_count() -> None:
    x, conv = _inputs()
    with pytest.raises(ValueError, match="channels"):
        causal_conv1d(x[..., : D - 1], conv.weight)


def test_rejects_unknown_activation() -> None:
    x, conv = _inputs()
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d(x, conv.weight, activation="gelu")


@pytest.mark.parametrize("documents", [None, [0, 1, 9, 11, T]], ids=["one-sequence", "packed"])
def test_conv_state_shares_sum_to_the_whole_sequences(documents) -> None:
    """conv_state is the last W tokens of each sequence (document), zeros before its start; the shares of
    zigzag shards (each rank's tokens with their global positions) sum to it exactly."""
    x, _ = _inputs()
    x = x[:1] if documents else x
    whole = conv_state(x, W, documents)
    bounds = documents or [0, T]
    for d, (a, b) in enumerate(pairwise(bounds)):
        tokens = x[0, max(a, b - W) : b].T  # [D, <= W], the document's last tokens
        assert torch.equal(whole[d, :, W - tokens.shape[1] :], tokens)
        assert not whole[d, :, : W - tokens.shape[1]].any()
    pieces = torch.arange(T).tensor_split(6)  # zigzag over 3 ranks: pieces r and 5 - r
    total = torch.zeros_like(whole)
    for r in range(3):
        positions = torch.cat([pieces[r], pieces[5 - r]])
        total += conv_state(x[:, positions], W, documents, positions=positions, seq_len=T)
    assert torch.equal(total, whole)
