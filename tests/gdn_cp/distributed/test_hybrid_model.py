"""The hybrid model (3 GDN : 1 full-attention layers) under CP: loss, logits and every gradient."""

from __future__ import annotations

import cp_ranks
import pytest
import torch

from gdn_cp.distributed import MODES
from tests.gdn_cp.ops.helpers import tolerance

pytestmark = pytest.mark.multirank
BATCH = 2  # cp_ranks.hybrid_comparison's batch


@pytest.mark.parametrize("world", cp_ranks.HYBRID_WORLDS, ids=lambda w: f"cp{w}")
@pytest.mark.parametrize("mode", MODES)
def test_hybrid_model_under_cp_matches_single_rank(world_results, mode: str, world: int) -> None:
    errors = world_results(world)[0]["hybrid"][mode]  # relative to the reference's scale, in fp64
    worst = max(errors, key=errors.get)
    # Every layer's outputs accumulate over the tokens and the hidden size; gradients of the weights also sum
    # over the batch, and the model is as deep as its layers.
    config = cp_ranks.Qwen35HybridConfig()
    seq_len = 8 * world
    terms = len(config.layer_types) * BATCH * seq_len * config.hidden_size
    assert errors[worst] <= tolerance(torch.float64, terms=terms), (worst, errors[worst])
    assert len(errors) > 20  # loss, logits and every parameter


@pytest.mark.parametrize("world", cp_ranks.HYBRID_WORLDS, ids=lambda w: f"cp{w}")
@pytest.mark.parametrize("mode", MODES)
def test_transformers_qwen35_under_cp_matches_single_rank(world_results, mode: str, world: int) -> None:
    """transformers' Qwen3_5ForCausalLM with every GDN layer under `mode` and Ulysses full attention: logits
    and every gradient equal the single-rank model, and parameter names and shapes are unchanged."""
    errors = dict(world_results(world)[0]["transformers_qwen35"][mode])
    assert errors.pop("names") == 1.0
    worst = max(errors, key=errors.get)
    # transformers' RMSNorms compute in fp32 even in an fp64 model: the CP and single-rank models round
    # slightly different values there, so the bound is fp32's, over the model's depth, tokens and width.
    c = cp_ranks.QWEN35_CONFIG
    terms = c["num_hidden_layers"] * BATCH * 8 * world * c["hidden_size"]
    assert errors[worst] <= tolerance(torch.float32, terms=terms), (worst, errors[worst])
    assert len(errors) > 40  # logits and every parameter
