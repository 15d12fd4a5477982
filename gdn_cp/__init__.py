"""gdn_cp: Gated DeltaNet (linear attention) ops, the Qwen3.5 GDN layer, and context parallelism for it."""

from gdn_cp.distributed import CPOptions, LinearAttentionContextParallel, all_reduce_gradients
from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig, GDNState

__version__ = "0.1.0"

__all__ = [
    "CPOptions",
    "GDNState",
    "GatedDeltaNet",
    "GatedDeltaNetConfig",
    "LinearAttentionContextParallel",
    "__version__",
    "all_reduce_gradients",
]
