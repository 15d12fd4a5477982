"""transformers' Qwen3.5 model with gdn_cp's GDN layers (no CP here; under CP: tests/gdn_cp/distributed)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

from gdn_cp.models.qwen35_transformers import TransformersGatedDeltaNet, use_gdn_cp_layers
from tests.gdn_cp.ops.helpers import assert_close_scaled

CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
}


@pytest.fixture(scope="module")
def models() -> tuple[Qwen3_5ForCausalLM, Qwen3_5ForCausalLM]:
    torch.manual_seed(0)
    hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**CONFIG)).eval()
    return hf, use_gdn_cp_layers(copy.deepcopy(hf))


def test_the_model_computes_what_it_did_with_the_same_weights(models) -> None:
    hf, ours = models
    assert sum(isinstance(m, TransformersGatedDeltaNet) for m in ours.modules()) == 3  # 3 linear : 1 full
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in hf.state_dict().items()
    }
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = hf(input_ids=ids, use_cache=False).logits, ours(input_ids=ids, use_cache=False).logits
    # fp32 through 4 layers of T tokens and `hidden` features
    assert_close_scaled(got, want, torch.float32, terms=4 * 37 * CONFIG["hidden_size"])


def test_a_cache_and_padding_are_refused(models) -> None:
    _, ours = models
    layer = next(m for m in ours.modules() if isinstance(m, TransformersGatedDeltaNet))
    x = torch.randn(1, 5, CONFIG["hidden_size"])
    with pytest.raises(NotImplementedError, match="cannot use a cache"):
        layer(x, cache=object())
    with pytest.raises(NotImplementedError, match="padding masks are not supported"):
        layer(x, attention_mask=torch.tensor([[1, 1, 1, 0, 0]]))
    assert layer(x, attention_mask=torch.ones(1, 5)).shape == x.shape
