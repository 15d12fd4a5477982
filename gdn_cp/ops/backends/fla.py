"""flash-linear-attention's chunked gated delta rule (fla-core's Triton kernels) as a backend (`FLA`, its
entry), loaded on first use. Keep fla out of an environment where transformers' own parity matters:
transformers switches to FLA's kernels whenever `fla` imports.

On a CPU, Triton runs kernels only in its interpreter (TRITON_INTERPRET=1): exact in fp32, and 10-20x slower
than the eager op, so for tests and checks, never for timing; its bf16 kernels return garbage there (rel
error 9e9), so the entry refuses bf16 when interpreted (Backend.interpreted_dtypes). Two things in
Triton stop FLA's kernels there, both handled from outside by gdn_cp.ops.backends.interpreter when the op is
loaded under the interpreter.
"""

from __future__ import annotations

import importlib
import os

import torch

from gdn_cp.ops.backends.entry import Backend
from gdn_cp.ops.backends.fla_kcp import load_fla_kcp
from gdn_cp.ops.backends.fla_summary import load_fla_summary
from gdn_cp.ops.backends.interpreter import support_interpreter, support_problem

FLA_CHUNK_SIZES = (16, 32, 64)
"""Chunk sizes FLA's gated delta rule takes (fla-core 0.6)."""
FLA_MAX_HEAD_K_DIM = 256
"""FLA's state kernels hold K in up to four blocks of 64 rows."""


TRITON_TRUE = frozenset({"1", "y", "yes", "on", "true"})
"""The values of a Triton boolean environment variable that mean on (triton 3.9, `triton.knobs.env_bool`:
libtriton's getenv_bool compares the value, lower-cased, with these; no whitespace is stripped)."""


def triton_interpreted() -> bool:
    """Whether Triton would interpret kernels in this process: TRITON_INTERPRET read exactly as Triton reads
    it (`knobs.runtime.interpret`): "1", "y", "yes", "on" or "true" in any case, nothing stripped (" 1" is
    off: Triton compiles then, and so must we believe)."""
    value = os.environ.get("TRITON_INTERPRET")
    return value is not None and value.isascii() and value.lower() in TRITON_TRUE


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


FLA = Backend(
    name="fla",
    description="flash-linear-attention's Triton kernels (fla-core), imported on first use",
    load=load_fla,
    devices=("cuda", "npu", "cpu"),
    chunk_sizes=FLA_CHUNK_SIZES,
    max_head_k_dim=FLA_MAX_HEAD_K_DIM,
    packages=("fla-core", "flash-linear-attention", "triton"),
    device_problem=fla_device_problem,
    interpreted=triton_interpreted,
    # interpreted, its bf16 kernels return garbage (rel error 9e9 against the fp64 reference; NumPy, which
    # the interpreter computes in, has no bf16); fp16 stays within fp16's rounding (1e-3), fp32 2e-7
    interpreted_dtypes=(torch.float32, torch.float16),
    interpreter_problem=support_problem,
    modules=("fla.ops.gated_delta_rule", "triton"),
    source=("fla.", "gdn_cp.ops.backends.fla_"),  # its op, and the hook and pair built on its kernels
    summary=load_fla_summary,
    kcp=load_fla_kcp,
)
"""Backend fla's entry."""
