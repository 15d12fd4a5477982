"""The rank function makes the same weights on every rank and shards of one global input, from the seed."""

from __future__ import annotations

import bench_ranks
import pytest
import torch
from tiny import tiny_scenario

from bench.launch.local import run_on_ranks
from bench.measure.inputs import INPUT, OUTPUT_GRAD, global_tensor
from bench.suite.config import Sweep

pytestmark = pytest.mark.multirank


def test_same_weights_on_every_rank_and_contiguous_shards_of_one_input():
    (case,) = tiny_scenario(
        seed=7,
        sweep=Sweep(cp=[2], seq_len=[12], mode=["p2p"], pass_=["forward"]),
    ).cases(warmup=0, repeat=1)
    ranks = run_on_ranks(bench_ranks.built_tensors, 2, (case, "cpu"))
    for p0, p1 in zip(ranks[0]["params"], ranks[1]["params"], strict=True):
        assert torch.equal(p0, p1)
    # the global input and output gradient, drawn as the worker draws them, split in rank order
    shape = (1, 12, case.layer.hidden_size)
    x = global_tensor(shape, torch.float32, seed=case.seed, stream=INPUT)
    grad = global_tensor(shape, torch.float32, seed=case.seed, stream=OUTPUT_GRAD)
    assert torch.equal(torch.cat([r["x"] for r in ranks], dim=1), x)
    assert torch.equal(torch.cat([r["grad"] for r in ranks], dim=1), grad)
    assert ranks[0]["x"].shape == (1, 6, case.layer.hidden_size)
