"""Dtype names as configs and scenarios spell them."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "fp64": torch.float64,
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def to_dtype(value: str | torch.dtype, field: str = "dtype") -> torch.dtype:
    """A torch.dtype from a dtype or one of the names in DTYPES; ValueError naming `field` otherwise."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.lower() in DTYPES:
        return DTYPES[value.lower()]
    raise ValueError(f"{field}: unknown dtype {value!r}; use one of {', '.join(sorted(DTYPES))}")


def dtype_name(dtype: torch.dtype) -> str:
    """The short name used in results: bf16, fp16, fp32, fp64."""
    return {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[
        dtype
    ]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64; everything else (fp32, bf16, fp16) accumulates in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
