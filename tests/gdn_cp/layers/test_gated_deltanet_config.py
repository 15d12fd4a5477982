"""GatedDeltaNetConfig: validation (ValueError naming the field), dtype names, and from_hf_config."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig

SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "num_k_heads": 2,
    "num_v_heads": 4,
    "head_k_dim": 16,
    "head_v_dim": 8,
}


def _config(**overrides: Any) -> GatedDeltaNetConfig:
    return GatedDeltaNetConfig(**{**SIZES, **overrides})


@pytest.mark.parametrize(
    "field, value",
    [
        pytest.param(field, value, id=f"{field}={value!r}")
        for field in (*SIZES, "conv_kernel_size", "chunk_size")
        for value in (0, -1)
    ]
    + [
        pytest.param("chunk_size", 16.0, id="chunk_size=16.0"),
        pytest.param("chunk_size", True, id="chunk_size=True"),
    ],
)
def test_rejects_non_positive_sizes(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"GatedDeltaNetConfig.{field} must be a positive integer"):
        _config(**{field: value})


def test_rejects_hv_not_multiple_of_hk() -> None:
    with pytest.raises(ValueError, match=r"num_v_heads 6 is not a multiple of num_k_heads \(4\)"):
        _config(num_k_heads=4, num_v_heads=6)


def test_rejects_non_positive_eps() -> None:
    with pytest.raises(ValueError, match="rms_norm_eps"):
        _config(rms_norm_eps=0.0)


def test_rejects_unknown_dtype_name() -> None:
    with pytest.raises(ValueError, match=r"GatedDeltaNetConfig\.dtype: unknown dtype 'bf17'"):
        _config(dtype="bf17")


@pytest.mark.parametrize(
    "name, dtype",
    [("bf16", torch.bfloat16), ("fp32", torch.float32), ("float64", torch.float64), ("BF16", torch.bfloat16)],
)
def test_dtype_names(name: str, dtype: torch.dtype) -> None:
    config = _config(dtype=name)
    assert config.dtype == dtype
    assert all(p.dtype == dtype for p in GatedDeltaNet(config).parameters())


def test_from_hf_config_maps_fields() -> None:
    text = SimpleNamespace(
        hidden_size=96,
        linear_num_key_heads=3,
        linear_num_value_heads=6,
        linear_key_head_dim=32,
        linear_value_head_dim=24,
        linear_conv_kernel_dim=5,
        rms_norm_eps=1e-5,
    )
    # A multimodal Qwen3.5 config nests the text config; both forms are accepted.
    for hf in (text, SimpleNamespace(text_config=text)):
        config = GatedDeltaNetConfig.from_hf_config(hf, chunk_size=32, dtype="bf16")
        assert (config.hidden_size, config.num_k_heads, config.num_v_heads) == (96, 3, 6)
        assert (config.head_k_dim, config.head_v_dim, config.conv_kernel_size) == (32, 24, 5)
        assert config.rms_norm_eps == 1e-5
        assert config.chunk_size == 32 and config.dtype == torch.bfloat16
        assert (config.key_dim, config.value_dim, config.conv_dim) == (96, 144, 336)
