"""Model layers built on gdn_cp.ops."""

from gdn_cp.layers.gated_deltanet import GatedDeltaNet, GatedDeltaNetConfig, GDNProjections

__all__ = ["GDNProjections", "GatedDeltaNet", "GatedDeltaNetConfig"]
