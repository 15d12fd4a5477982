"""flash-linear-attention's chunked gated delta rule (fla-core's Triton kernels) as a backend, loaded on first
use. Keep fla out of an environment where transformers' own parity matters: transformers switches to FLA's
kernels whenever `fla` imports.

On a CPU, Triton runs kernels only in its interpreter (TRITON_INTERPRET=1): exact, and 10-20x slower than the
eager op, so for tests and checks, never for timing. Two things in Triton stop FLA's kernels there, both
handled from outside by gdn_cp.ops.backends.interpreter when the op is loaded under the interpreter.
"""

from __future__ import annotations

import importlib
import os

from gdn_cp.ops.backends.interpreter import support_interpreter

FLA_CHUNK_SIZES = (16, 32, 64)
"""Chunk sizes FLA's gated delta rule takes (fla-core 0.6)."""
FLA_MAX_HEAD_K_DIM = 256
"""FLA's state kernels hold K in up to four blocks of 64 rows."""


def triton_interpreted() -> bool:
    """Whether Triton would interpret kernels in this process (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in {"1", "true", "yes", "on"}


def fla_device_problem(device_type: str) -> str | None:
    """Why FLA's kernels cannot run on `device_type` here (None: they can)."""
    if device_type == "cpu" and not triton_interpreted():
        return (
            "backend 'fla' runs on a CPU only under Triton's interpreter (TRITON_INTERPRET=1 in the "
            "environment, for tests: far too slow to time); use backend='gdn_cp' on the CPU"
        )
    return None


def load_fla():
    """FLA's `chunk_gated_delta_rule`; ImportError naming what to install when fla is missing."""
    try:
        module = importlib.import_module("fla.ops.gated_delta_rule")
    except ImportError as error:
        raise ImportError(
            f"backend 'fla' needs flash-linear-attention's kernels ({error}): pip install fla-core triton "
            "(the Triton build that matches your torch), in an environment without transformers' parity "
            "tests"
        ) from error
    if triton_interpreted():
        support_interpreter()
    return module.chunk_gated_delta_rule
