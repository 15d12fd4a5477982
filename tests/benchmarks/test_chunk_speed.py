"""Micro-benchmarks of the chunked GDN op, side by side in one run: gdn_cp.ops.chunk_gated_delta_rule, the
same op at an earlier commit (BASE_COMMIT, loaded from `git archive` as its own package), and transformers'
torch_chunk_gated_delta_rule; forward and forward+backward at T = 2K, 8K and 32K (B=1, Hk/Hv = 4/8,
K = V = 64, fp32, in-kernel q/k L2 norm, inputs requiring grad, chunk size 64 everywhere).

Not part of the test suite (pyproject's addopts ignore this folder and disable benchmarks). Run on purpose, on
an idle machine:

    python -m pytest tests/benchmarks -p no:cacheprovider --benchmark-enable -o addopts="" \\
        --benchmark-columns=median,iqr,rounds --benchmark-group-by=group

Each case records in its extra_info the model FLOPs of the pass (gdn_cp.ops.chunk_gdn_flops), the achieved
GFLOP/s at the median, and the peak memory per token above the start of one pass (CPU profiler meter,
bench.measure.memory). Add `--benchmark-json=bench.json` to keep the numbers. Each T first passes a
correctness gate (our output and input gradients equal transformers' on the same inputs); a failed gate fails
the benchmark before anything is timed, so no speedup is ever reported for a wrong result.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from bench.measure.memory import profiler_peak_above_start
from gdn_cp.ops import chunk_gated_delta_rule, chunk_gdn_flops
from tests.gdn_cp.ops.helpers import assert_close_scaled

B, HK, HV, K, V = 1, 4, 8, 64, 64
CHUNK = 64  # every implementation's default chunk size
BASE_COMMIT = os.environ.get("GDN_BENCH_BASE", "3a5176f")
"""The commit whose op is timed beside ours (GDN_BENCH_BASE overrides): the op before the hand-written
backward."""
# Rounds per (T, pass): transformers' fwd+bwd takes ~2 s a round at 8K and grows faster than linearly.
ROUNDS = {
    (2048, "fwd"): 10,
    (2048, "fwd+bwd"): 5,
    (8192, "fwd"): 5,
    (8192, "fwd+bwd"): 3,
    (32768, "fwd"): 2,
    (32768, "fwd+bwd"): 1,
}
LENGTHS = (2048, 8192, 32768)

Inputs = tuple[torch.Tensor, ...]
ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _base_op() -> Callable[..., Any] | None:
    """BASE_COMMIT's chunk_gated_delta_rule, from its gdn_cp/ops (and gdn_cp/dtypes.py) extracted with `git
    archive` into a temporary package `gdn_cp_base` (its `gdn_cp.` imports rewritten); None outside a git
    checkout or when the commit is unknown."""
    try:
        archive = subprocess.run(
            ["git", "archive", BASE_COMMIT, "gdn_cp/ops", "gdn_cp/dtypes.py"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    folder = Path(tempfile.mkdtemp(prefix="gdn_cp_base-"))
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(folder, filter="data")
    package = folder / "gdn_cp_base"
    (folder / "gdn_cp").rename(package)
    (package / "__init__.py").write_text(f'"""gdn_cp at {BASE_COMMIT}: ops only."""\n')
    for path in package.rglob("*.py"):
        path.write_text(re.sub(r"\bgdn_cp\.", "gdn_cp_base.", path.read_text()))
    sys.path.insert(0, str(folder))
    return importlib.import_module("gdn_cp_base.ops").chunk_gated_delta_rule


IMPLS: dict[str, Callable[[], Callable[..., Any] | None]] = {
    "gdn_cp": lambda: chunk_gated_delta_rule,
    f"gdn_cp@{BASE_COMMIT}": _base_op,
    "transformers": lambda: torch_chunk_gated_delta_rule,
}


def _inputs(T: int) -> Inputs:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, HK, K, generator=gen)
    k = torch.randn(B, T, HK, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, generator=gen))
    beta = torch.rand(B, T, HV, generator=gen)
    return tuple(x.requires_grad_() for x in (q, k, v, g, beta))


def _op(impl: str) -> Callable[..., Any]:
    op = IMPLS[impl]()
    if op is None:
        pytest.skip(f"{impl}: commit {BASE_COMMIT} cannot be read with git archive here")
    return op


def _forward(op: Callable[..., Any], x: Inputs) -> torch.Tensor:
    o, _ = op(*x, use_qk_l2norm_in_kernel=True, chunk_size=CHUNK)
    return o


def _forward_backward(op: Callable[..., Any], x: Inputs, do: torch.Tensor) -> Inputs:
    return torch.autograd.grad(_forward(op, x), x, grad_outputs=do)


@functools.cache
def checked_inputs(T: int) -> tuple[Inputs, torch.Tensor]:
    """Inputs and an output gradient for length T, after the correctness gate (cached: runs once per T)."""
    x = _inputs(T)
    do = torch.randn(B, T, HV, V, generator=torch.Generator().manual_seed(1))
    # Both are chunked (fp32): an entry accumulates T / CHUNK state hand-offs and CHUNK tokens within its
    # chunk, each a K-long dot product; the log-decay's gradient also sums, per token, over the pairs of its
    # chunk and the K x V state (C (C (K + V) + K V) products whose signs cancel).
    terms = (T // CHUNK + CHUNK) * K
    decay_terms = CHUNK * (CHUNK * (K + V) + K * V)
    ours, ref = _op("gdn_cp"), _op("transformers")
    msg = "correctness gate: outputs differ from transformers':"
    assert_close_scaled(_forward(ours, x), _forward(ref, x), torch.float32, terms=terms, msg=msg)
    grads_ours, grads_ref = _forward_backward(ours, x, do), _forward_backward(ref, x, do)
    for name, a, b in zip(("q", "k", "v", "g", "beta"), grads_ours, grads_ref, strict=True):
        msg = f"correctness gate: d{name} differs from transformers':"
        assert_close_scaled(a, b, torch.float32, terms=terms * (decay_terms if name == "g" else 1), msg=msg)
    return x, do


CASES = [
    pytest.param(
        T, pass_, impl, marks=pytest.mark.benchmark(group=f"T{T}-{pass_}"), id=f"T{T}-{pass_}-{impl}"
    )
    for T in LENGTHS
    for pass_ in ("fwd", "fwd+bwd")
    for impl in IMPLS
]


@pytest.mark.parametrize("T, pass_, impl", CASES)
def test_chunk_speed(benchmark: Any, T: int, pass_: str, impl: str) -> None:
    x, do = checked_inputs(T)
    op = _op(impl)
    backward = pass_ == "fwd+bwd"
    fn, args = (_forward_backward, (op, x, do)) if backward else (_forward, (op, x))
    flops = chunk_gdn_flops(
        batch=B,
        seq_len=T,
        num_k_heads=HK,
        num_v_heads=HV,
        head_k_dim=K,
        head_v_dim=V,
        chunk_size=CHUNK,
        backward=backward,
    )
    peak = profiler_peak_above_start(lambda: fn(*args))
    benchmark.extra_info.update(
        {
            "T": T,
            "pass": pass_,
            "impl": impl,
            "threads": torch.get_num_threads(),
            "model_gflop": flops / 1e9,
            "peak_kib_per_token": peak / 1024 / T,
        }
    )
    benchmark.pedantic(fn, args=args, rounds=ROUNDS[T, pass_], warmup_rounds=1)
    benchmark.extra_info["gflop_per_s"] = flops / 1e9 / benchmark.stats.stats.median
