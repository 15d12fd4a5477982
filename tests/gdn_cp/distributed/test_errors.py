"""Every error path of LinearAttentionContextParallel, and what CP must keep (names, shapes, DTensors)."""

from __future__ import annotations

import cp_ranks
import pytest
import torch

from gdn_cp import GatedDeltaNetConfig, LinearAttentionContextParallel
from gdn_cp.distributed import MODES, check_cp_shapes
from tests.gdn_cp.ops.helpers import tolerance

pytestmark = pytest.mark.multirank


@pytest.fixture
def messages(world_results) -> dict[str, str]:
    """Each error path's exception, from a real group of 2 ranks (both ranks must agree)."""
    ranks = world_results(2)
    assert ranks[0]["errors"] == ranks[1]["errors"]
    return ranks[0]["errors"]


def test_unknown_mode_lists_the_modes() -> None:
    with pytest.raises(ValueError) as caught:
        LinearAttentionContextParallel(mode="ring")
    assert str(caught.value) == "unknown CP mode 'ring'; use one of ulysses, p2p, all_gather, scan"


def test_default_mode_is_ulysses() -> None:
    assert LinearAttentionContextParallel().mode == "ulysses" == MODES[0]


def test_check_cp_shapes_names_both_head_counts() -> None:
    config = GatedDeltaNetConfig(hidden_size=8, num_k_heads=2, num_v_heads=6, head_k_dim=4, head_v_dim=4)
    with pytest.raises(ValueError, match=r"num_k_heads=2 and num_v_heads=6 .* not divisible by 4"):
        check_cp_shapes("ulysses", config, 4)
    with pytest.raises(ValueError, match=r"num_k_heads=2 is not divisible by 3 \(num_v_heads=6 is\)"):
        check_cp_shapes("ulysses", config, 3)
    check_cp_shapes("p2p", config, 4)  # sequence-shard modes keep full heads
    with pytest.raises(ValueError, match="100 tokens does not split evenly over cp=8"):
        check_cp_shapes("all_gather", config, 8, seq_len=100)


def test_ulysses_refuses_heads_that_do_not_split(messages) -> None:
    assert messages["ulysses_heads"].startswith("ValueError: ulysses shards heads over cp=2")
    assert "num_k_heads=3 and num_v_heads=3" in messages["ulysses_heads"]


def test_tensor_parallel_is_refused(messages) -> None:
    assert messages["tp_group"].startswith("NotImplementedError: linear attention TP+CP is not supported yet")
    assert messages["tp_dtensor"].startswith("NotImplementedError: parameter 'out_proj.weight' is sharded")


def test_only_gated_deltanet_layers(messages) -> None:
    assert messages["not_a_gdn"].startswith(
        "TypeError: LinearAttentionContextParallel applies to a GatedDeltaNet"
    )


def test_shard_sequence_refuses_an_uneven_even_split(messages) -> None:
    # The layers take uneven shards (tests/gdn_cp/distributed/test_packed_documents.py); shard_sequence's
    # default even split says how to get one.
    assert "does not split evenly over cp=2" in messages["uneven_shard_sequence"]


def test_device_mesh_group_and_dtensor_round_trip(messages) -> None:
    kind, placements, err = messages["dtensor_output"].split(" ")
    assert kind == "DTensor" and placements == "(Shard(dim=1),)"
    # fp64, relative to the output's scale; the layer ran on 4 tokens per rank (2 ranks), each output
    # accumulating over the tokens and the hidden size.
    terms = 4 * 2 * cp_ranks.LAYER["hidden_size"]
    assert float(err.removeprefix("err=")) <= tolerance(torch.float64, terms=terms)


def test_state_dict_under_cp_loads_without_it(messages) -> None:
    assert messages["state_dict"] == "<All keys matched successfully>"
