"""Each rank draws only its own shard of the case's input and output gradient (bench.measure.inputs): the
shards are exactly the slices of the one global tensor that shard_sequence would cut, for any cp and layout,
and drawing them touches only the blocks the shard needs."""

from __future__ import annotations

import pytest
import torch

from bench.measure import inputs
from bench.measure.inputs import BLOCK_TOKENS, INPUT, OUTPUT_GRAD, global_tensor, local_ranges, shard_tensor


def _slice(x: torch.Tensor, cp: int, rank: int, layout: str) -> torch.Tensor:
    """shard_sequence's cut of the global x, without a process group."""
    if layout == "zigzag":
        pieces = x.chunk(2 * cp, dim=1)
        return torch.cat([pieces[rank], pieces[2 * cp - 1 - rank]], dim=1)
    return x.chunk(cp, dim=1)[rank]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_the_shards_are_the_slices_of_one_global_tensor(cp, layout):
    T = 2 * cp * 3 * BLOCK_TOKENS // 4  # pieces that start and end inside blocks
    shape = (2, T, 8)
    for stream in (INPUT, OUTPUT_GRAD):
        x = global_tensor(shape, torch.float32, seed=5, stream=stream)
        for rank in range(cp):
            ranges = local_ranges(T, cp, rank, layout)
            shard = shard_tensor(shape, torch.float32, seed=5, stream=stream, ranges=ranges)
            assert torch.equal(shard, _slice(x, cp, rank, layout)), (stream, rank)


def test_streams_and_seeds_differ_and_dtypes_round_the_same_values():
    shape = (1, 300, 4)
    a = global_tensor(shape, torch.float32, seed=0, stream=INPUT)
    assert not torch.equal(a, global_tensor(shape, torch.float32, seed=0, stream=OUTPUT_GRAD))
    assert not torch.equal(a, global_tensor(shape, torch.float32, seed=1, stream=INPUT))
    assert torch.equal(global_tensor(shape, torch.bfloat16, seed=0, stream=INPUT), a.to(torch.bfloat16))


def test_a_shard_draws_only_the_blocks_it_touches(monkeypatch):
    """Host memory and RNG time follow the tokens per rank: rank 7 of 8 draws 1/8 of a long sequence."""
    drawn: list[int] = []
    real = torch.randn

    def counting(*size, **kw):
        drawn.append(size[1])
        return real(*size, **kw)

    monkeypatch.setattr(inputs.torch, "randn", counting)
    T = 8 * 4 * BLOCK_TOKENS
    shard = shard_tensor(
        (1, T, 4), torch.float32, seed=0, stream=INPUT, ranges=local_ranges(T, 8, 7, "contiguous")
    )
    assert shard.shape == (1, T // 8, 4) and sum(drawn) == T // 8


def test_positions_outside_the_sequence_are_refused():
    with pytest.raises(ValueError, match=r"positions \[10, 20\) are not inside a sequence of 12 tokens"):
        shard_tensor((1, 12, 4), torch.float32, seed=0, stream=INPUT, ranges=[(10, 20)])
