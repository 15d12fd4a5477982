"""Loading a layer's weights out of a whole Qwen3.5 model's state_dict (as a checkpoint holds them)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig, linear_attn_state_dict
from tests.ops.helpers import assert_close_scaled


@pytest.fixture(scope="module")
def model() -> Qwen3_5ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
    )
    return Qwen3_5ForCausalLM(config).eval()


@pytest.mark.parametrize("layer_idx", [0, 2])
def test_layer_from_whole_model_state_dict_matches_the_model_layer(model, layer_idx: int) -> None:
    state = model.state_dict()
    assert any(k.startswith(f"model.layers.{layer_idx}.linear_attn.") for k in state)
    ours = GatedDeltaNet(GatedDeltaNetConfig.from_hf_config(model.config, chunk_size=8))
    ours.load_state_dict(linear_attn_state_dict(state, layer_idx), strict=True)
    x = torch.randn(2, 19, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model.model.layers[layer_idx].linear_attn(x)
        # fp32; one output accumulates T tokens of the core, each fed by hidden_size-long projections.
        assert_close_scaled(ours(x), ref, torch.float32, terms=x.shape[1] * x.shape[2])


def test_prefixes_of_multimodal_checkpoints_work_and_similar_names_do_not_match(model) -> None:
    state = {f"model.language_model.{k.removeprefix('model.')}": v for k, v in model.state_dict().items()}
    state["model.xlayers.0.linear_attn.A_log"] = torch.zeros(4)  # "layers.0" inside another name
    assert (
        linear_attn_state_dict(state, 0).keys()
        == dict(GatedDeltaNet(GatedDeltaNetConfig.from_hf_config(model.config)).named_parameters()).keys()
    )


def test_a_full_attention_layer_is_refused_with_the_reason(model) -> None:
    with pytest.raises(KeyError, match="layer 3 is not a linear-attention layer"):
        linear_attn_state_dict(model.state_dict(), 3)
