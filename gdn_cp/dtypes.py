"""Dtype names as configs and scenarios spell them, and the precision the ops' fp32 matmuls run in."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, get_args

import torch

Precision = Literal["fp32", "tf32"]
"""How the fp32 matmuls of the layer (the chunked core accumulates bf16 inputs in fp32) run on a device:
fp32, in full fp32 (TF32 off: far below the matrix units on a GPU or NPU); tf32, on the matrix units in
TF32 (NVIDIA) or HF32 (Ascend), 10-bit mantissas with fp32 accumulation, the state chain and every
elementwise op still fp32. The CPU has no such mode: there both are fp32."""
PRECISIONS: tuple[str, ...] = get_args(Precision)

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


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision: unknown {precision!r}; use one of {', '.join(PRECISIONS)}")


def _precision_flags(device_type: str) -> list[tuple[object, str]]:
    """The (namespace, attribute) flags that let fp32 matmuls and convolutions use the matrix units."""
    if device_type == "cuda":
        return [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32")]
    if device_type == "npu":
        npu = getattr(torch, "npu", None) or importlib.import_module("torch_npu").npu
        return [(npu.matmul, "allow_hf32"), (npu.conv, "allow_hf32")]
    return []


def current_precision(device_type: str) -> str:
    """The Precision fp32 matmuls run at now on `device_type` (what `matmul_precision` set): tf32 where the
    flags let them use the matrix units, else fp32 (always on cpu)."""
    flags = _precision_flags(device_type)
    return "tf32" if flags and all(getattr(space, name) for space, name in flags) else "fp32"


@contextmanager
def matmul_precision(precision: str, device_type: str) -> Iterator[None]:
    """Run the block's fp32 matmuls and convolutions at `precision` (Precision) on `device_type`, restoring
    the flags after: torch.backends.cuda.matmul / cudnn allow_tf32 on cuda, torch_npu's matmul / conv
    allow_hf32 on npu; nothing changes on cpu."""
    check_precision(precision)
    flags = _precision_flags(device_type)
    before = [getattr(space, name) for space, name in flags]
    try:
        for space, name in flags:
            setattr(space, name, precision == "tf32")
        yield
    finally:
        for (space, name), value in zip(flags, before, strict=True):
            setattr(space, name, value)
