"""The differentiable collectives, forward and backward, against single-process computations."""

from __future__ import annotations

import cp_ranks
import pytest
import torch

from tests.gdn_cp.ops.helpers import tolerance

pytestmark = pytest.mark.multirank


def _tol(world: int, length: int = 1) -> float:
    """fp64 bound on the errors relative to the reference's scale (cp_ranks returns them so): a result sums
    the contributions of up to `world` ranks, each `length` terms long (moved data has no error at all)."""
    return tolerance(torch.float64, terms=world * length)


WORLDS = pytest.mark.parametrize("world", [1, 2, 3, 4], ids=lambda w: f"cp{w}")


def _each_rank(world_results, world: int, key: str):
    return [rank[key] for rank in world_results(world)]


@WORLDS
def test_all_to_all_single_uneven_and_empty_splits(world_results, world: int) -> None:
    for r in _each_rank(world_results, world, "a2a_single"):
        assert r["forward"] <= _tol(world) and r["backward"] <= _tol(world), r


@WORLDS
@pytest.mark.parametrize(("local_seq", "batch"), [(1, 1), (3, 2)], ids=["B1-L1", "B2-L3"])
def test_ulysses_round_trip_with_backward(world_results, world: int, local_seq: int, batch: int) -> None:
    """The PR's Shard(sequence) -> Shard(head) -> Shard(sequence) round trip (B=1, local seq 1 included)."""
    for r in _each_rank(world_results, world, "ulysses_round_trip"):
        assert max(r[(local_seq, batch)].values()) <= _tol(world), r


@WORLDS
@pytest.mark.parametrize("local_seq", [1, 2, 5], ids=lambda n: f"L{n}")
def test_exchange_halo_spans_earlier_ranks(world_results, world: int, local_seq: int) -> None:
    for r in _each_rank(world_results, world, "halo"):
        h = r[local_seq]
        assert h["length"] == 0 and h["forward"] <= _tol(world) and h["backward"] <= _tol(world), h


@WORLDS
def test_all_gather_stack_backward_sums_each_slot_home(world_results, world: int) -> None:
    for r in _each_rank(world_results, world, "all_gather_stack"):
        assert max(r.values()) <= _tol(world), r


@WORLDS
def test_state_chain_matches_a_sequential_fold(world_results, world: int) -> None:
    for r in _each_rank(world_results, world, "state_chain"):
        assert max(r.values()) <= _tol(world, cp_ranks.STATE_K), r
        assert ("grad_S" in r) == (world > 1)


@WORLDS
def test_all_reduce_gradients_sums_every_dtype(world_results, world: int) -> None:
    assert max(_each_rank(world_results, world, "all_reduce_gradients")) == 0
