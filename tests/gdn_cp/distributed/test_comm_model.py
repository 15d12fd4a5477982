"""Bytes counted on the wire during real steps == the analytic model of gdn_cp.distributed.comm_model."""

from __future__ import annotations

import cp_ranks
import pytest

from gdn_cp.distributed.comm_model import layer_communication

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("world", [1, 2, 3, 4], ids=lambda w: f"cp{w}")
def test_measured_bytes_equal_the_model(world_results, world: int) -> None:
    for rank, results in enumerate(world_results(world)):
        measured = results["communication"]
        assert len(measured) == 2 * len(cp_ranks.modes_for(world))
        for case, (counted, model) in measured.items():
            assert counted == model, (f"rank {rank}", case, counted, model)


def test_model_scaling() -> None:
    """Ulysses volume per rank shrinks with cp at fixed T; the sequence-shard modes move only states."""
    config = cp_ranks.layer_config("bf16")

    def total(mode: str, cp: int, rank: int) -> int:
        v = layer_communication(mode, config, cp=cp, rank=rank, seq_len=4096, batch=1)
        return sum(k["sent"] for k in v.values())

    assert total("ulysses", 4, 0) < total("ulysses", 2, 0)
    # the middle rank of p2p sends one state each way, plus its halo share: far less than ulysses at this T
    assert total("p2p", 4, 1) < total("ulysses", 4, 1) / 10
    assert layer_communication("p2p", config, cp=1, rank=0, seq_len=8) == {}
