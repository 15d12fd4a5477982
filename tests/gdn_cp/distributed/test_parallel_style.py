"""LinearAttentionContextParallel as a torch ParallelStyle: parallelize_module over a 1-D mesh gives the
single-device model's outputs and gradients, honours src_data_rank, and keeps the style's fields fixed."""

from __future__ import annotations

import inspect
from pathlib import Path

import cp_ranks
import pytest
import torch
from torch.distributed.tensor.parallel import ParallelStyle

import gdn_cp
from gdn_cp import CPOptions, LinearAttentionContextParallel
from gdn_cp.accuracy import compare_layer_under_cp, compare_prefill_under_cp
from gdn_cp.distributed import cp_chunk_gated_delta_rule
from gdn_cp.distributed.modes import OPTION_FIELDS
from gdn_cp.models import Qwen35HybridConfig, apply_context_parallel
from gdn_cp.models.qwen35_transformers import apply_context_parallel_to_qwen35
from tests.gdn_cp.ops.helpers import tolerance

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
        "LinearAttentionContextParallel(CPOptions(mode='p2p', layout='contiguous', checkpoint_summary=False, "
        "overlap=False, backend=None))"
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


def test_one_options_record_from_end_to_end() -> None:
    """Issue 44: every CP surface takes one CPOptions (whole, or its fields by name) and none re-spells its
    fields or their defaults; the defaults are written once, in CPOptions."""
    surfaces = [
        LinearAttentionContextParallel.__init__,
        apply_context_parallel,
        apply_context_parallel_to_qwen35,
        cp_chunk_gated_delta_rule,
        compare_layer_under_cp,
        compare_prefill_under_cp,
    ]
    for surface in surfaces:
        parameters = inspect.signature(surface).parameters
        assert "options" in parameters, surface.__qualname__
        assert not set(parameters) & set(OPTION_FIELDS), surface.__qualname__
    source = "\n".join(p.read_text() for p in Path(gdn_cp.__file__).parent.rglob("*.py"))
    # checkpoint_summary's default, None, is the backend's choice, resolved in one place
    assert CPOptions().checkpoint_summary is None
    assert source.count("def checkpoint_for(") == 2  # CPMode's (no summary) and SequenceShardMode's
    style = LinearAttentionContextParallel(mode="scan", overlap=True, layout="zigzag")
    assert style.options == CPOptions(mode="scan", overlap=True, layout="zigzag")
    assert LinearAttentionContextParallel(style.options) == style
    with pytest.raises(ValueError, match=r"unknown CP option 'linear_attention_mode'"):
        CPOptions.build(None, linear_attention_mode="p2p")
    both = r"whole \(options=CPOptions\(...\)\) or as fields \(mode\), not both"
    with pytest.raises(ValueError, match=both):
        CPOptions.build(CPOptions(), mode="p2p")
