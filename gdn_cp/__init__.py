"""gdn_cp: Gated DeltaNet (linear attention) ops, the Qwen3.5 GDN layer, and context parallelism for it."""

from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig

__version__ = "0.1.0"

__all__ = ["GatedDeltaNet", "GatedDeltaNetConfig", "__version__"]
