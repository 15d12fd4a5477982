"""Models built from gdn_cp layers: a tiny Qwen3.5-style hybrid for tests and accuracy runs."""

from gdn_cp.models.parallelize import apply_context_parallel
from gdn_cp.models.qwen35_hybrid import Qwen35Hybrid, Qwen35HybridConfig

__all__ = ["Qwen35Hybrid", "Qwen35HybridConfig", "apply_context_parallel"]
