"""Model layers built on gdn_cp.ops."""

from gdn_cp.layers.gated_deltanet import (
    GatedDeltaNet,
    GatedDeltaNetConfig,
    GDNProjections,
    ShardForward,
    linear_attn_state_dict,
)

__all__ = ["GDNProjections", "GatedDeltaNet", "GatedDeltaNetConfig", "ShardForward", "linear_attn_state_dict"]
