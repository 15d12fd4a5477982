"""Model layers built on gdn_cp.ops, and loading their weights from Qwen3.5 checkpoints."""

from gdn_cp.layers.checkpoint import linear_attn_keys, linear_attn_state_dict, load_linear_attn_state_dict
from gdn_cp.layers.gated_deltanet import (
    GatedDeltaNet,
    GatedDeltaNetConfig,
    GDNProjections,
    GDNState,
    ShardForward,
    seeded_layer,
)

__all__ = [
    "GDNProjections",
    "GDNState",
    "GatedDeltaNet",
    "GatedDeltaNetConfig",
    "ShardForward",
    "linear_attn_keys",
    "linear_attn_state_dict",
    "load_linear_attn_state_dict",
    "seeded_layer",
]
