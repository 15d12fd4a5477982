"""transformers' torch fallback of the Qwen3.5 gated delta rule (`torch_chunk_gated_delta_rule`) as a backend:
a peer reference computed in fp32, one sequence per call, q scaled by K^-1/2 (it takes no scale)."""

from __future__ import annotations

import importlib


def load_torch_fallback():
    """transformers' `torch_chunk_gated_delta_rule`; ImportError naming what to install when it is missing."""
    try:
        module = importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5")
    except ImportError as error:
        raise ImportError(
            f"backend 'transformers' needs transformers with Qwen3.5 ({error}): pip install 'transformers>=5'"
        ) from error
    return module.torch_chunk_gated_delta_rule
