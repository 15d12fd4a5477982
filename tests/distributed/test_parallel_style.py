"""LinearAttentionContextParallel as a torch ParallelStyle: parallelize_module over a 1-D mesh gives the
single-device model's outputs and gradients, honours src_data_rank, and keeps the style's fields fixed."""

from __future__ import annotations

import cp_ranks
import pytest
import torch
from torch.distributed.tensor.parallel import ParallelStyle

from gdn_cp import LinearAttentionContextParallel
from gdn_cp.models import Qwen35HybridConfig
from tests.ops.helpers import tolerance

WORLD = 2  # cp_ranks.run_world runs parallel_style_checks at this world size


@pytest.fixture
def ranks(world_results) -> list[dict]:
    """Each rank's cp_ranks.parallel_style_checks results, from a real group of 2 ranks."""
    return [r["parallel_style"] for r in world_results(WORLD)]


def test_is_a_parallel_style_with_fixed_fields() -> None:
    style = LinearAttentionContextParallel(mode="p2p", checkpoint_summary=False)
    assert isinstance(style, ParallelStyle)
    assert (style.mode, style.checkpoint_summary, style.src_data_rank) == ("p2p", False, 0)
    with pytest.raises(AttributeError, match=r"LinearAttentionContextParallel.mode is read-only"):
        style.mode = "ulysses"  # type: ignore[misc]
    with pytest.raises(AttributeError, match=r"checkpoint_summary is read-only"):
        style.checkpoint_summary = True  # type: ignore[misc]
    # parallelize_module assigns src_data_rank on every call; it is not part of the style's identity.
    style.src_data_rank = None
    assert style.src_data_rank is None
    same = LinearAttentionContextParallel(mode="p2p", checkpoint_summary=False)
    assert style == same and hash(style) == hash(same)
    assert repr(style) == (
        "LinearAttentionContextParallel(mode='p2p', checkpoint_summary=False, layout='contiguous', "
        "overlap=False, backend=None)"
    )
    with pytest.raises(AttributeError, match=r"overlap is read-only"):
        style.overlap = True  # type: ignore[misc]


@pytest.mark.multirank
def test_parallelize_module_matches_the_single_device_model(ranks) -> None:
    config = Qwen35HybridConfig(**cp_ranks.STYLE_CONFIG)
    seq_len = 8 * WORLD
    # fp64, relative to the reference's scale: every layer's outputs accumulate over the tokens and the
    # hidden size, weight gradients also over the batch, and the model is as deep as its layers.
    terms = len(config.layer_types) * cp_ranks.STYLE_BATCH * seq_len * config.hidden_size
    bound = tolerance(torch.float64, terms=terms)
    for rank in ranks:
        assert rank["modes"] == {key: tuple(v) for key, v in cp_ranks.STYLE_PLAN.items()}
        errors = rank["errors"]
        worst = max(errors, key=errors.get)
        assert errors[worst] <= bound, (worst, errors[worst], bound)
        # logits and every parameter: embedding, 3 x (9 GDN + 5 MLP/norm), final norm, lm_head
        assert len(errors) == 1 + (1 + 3 * 14 + 2)


@pytest.mark.multirank
def test_src_data_rank_broadcasts_the_source_ranks_parameters(ranks) -> None:
    for rank in ranks:
        assert rank["seeds_differ"] > 0  # each rank built its layer from another seed
        assert rank["src_data_rank=1"] == 0.0  # exactly rank 1's, on every rank
        assert rank["src_data_rank=None"] == 0.0  # exactly this rank's own


@pytest.mark.multirank
def test_parallelize_module_errors_name_the_fix(ranks) -> None:
    messages = ranks[0]
    assert messages["not_a_gdn_in_plan"].startswith(
        "TypeError: LinearAttentionContextParallel applies to a GatedDeltaNet, got MLP"
    )
    assert "'layers.0.linear_attn'" in messages["not_a_gdn_in_plan"]
    assert messages["bad_src_data_rank"].startswith(
        "ValueError: src_data_rank=5 is not a rank of the CP group of 2 ranks"
    )
    assert messages["untouched_after_bad_src"] == "True"  # refused before the layer was changed
    for key in ("not_a_gdn_in_plan", "bad_src_data_rank", "untouched_after_bad_src"):
        assert ranks[1][key] == messages[key]
