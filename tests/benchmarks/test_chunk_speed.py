"""Micro-benchmarks: gdn_cp.ops.chunk_gated_delta_rule against transformers' torch_chunk_gated_delta_rule,
forward and forward+backward, at T = 2048 and 8192 (B=1, Hk/Hv = 4/8, K = V = 64, fp32, in-kernel q/k L2 norm,
inputs requiring grad, chunk size 64 on both sides).

Not part of the test suite (pyproject's addopts ignore this folder and disable benchmarks). Run on purpose:

    python -m pytest tests/benchmarks -p no:cacheprovider --benchmark-enable -o addopts=""

Add `--benchmark-json=bench.json` to keep the numbers. Each benchmark first passes a correctness gate (our
output and input gradients equal transformers' on the same inputs); a failed gate fails the benchmark before
anything is timed, so no speedup is ever reported for a wrong result.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from gdn_cp.ops import chunk_gated_delta_rule
from tests.ops.helpers import assert_close_scaled

B, HK, HV, K, V = 1, 4, 8, 64, 64
CHUNK = 64  # both implementations' default chunk size
IMPLS: dict[str, Callable[..., Any]] = {
    "gdn_cp": chunk_gated_delta_rule,
    "transformers": torch_chunk_gated_delta_rule,
}
# Rounds per (T, pass): transformers' fwd+bwd at 8192 takes ~2 s a round.
ROUNDS = {(2048, "fwd"): 10, (2048, "fwd+bwd"): 5, (8192, "fwd"): 5, (8192, "fwd+bwd"): 3}

Inputs = tuple[torch.Tensor, ...]


def _inputs(T: int) -> Inputs:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, HK, K, generator=gen)
    k = torch.randn(B, T, HK, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, generator=gen))
    beta = torch.rand(B, T, HV, generator=gen)
    return tuple(x.requires_grad_() for x in (q, k, v, g, beta))


def _forward(impl: str, x: Inputs) -> torch.Tensor:
    o, _ = IMPLS[impl](*x, use_qk_l2norm_in_kernel=True)
    return o


def _forward_backward(impl: str, x: Inputs, do: torch.Tensor) -> Inputs:
    return torch.autograd.grad(_forward(impl, x), x, grad_outputs=do)


@functools.cache
def checked_inputs(T: int) -> tuple[Inputs, torch.Tensor]:
    """Inputs and an output gradient for length T, after the correctness gate (cached: runs once per T)."""
    x = _inputs(T)
    do = torch.randn(B, T, HV, V, generator=torch.Generator().manual_seed(1))
    # Both are chunked (fp32): an entry accumulates T / CHUNK state hand-offs and CHUNK tokens within its
    # chunk, each a K-long dot product.
    terms = (T // CHUNK + CHUNK) * K
    o_ours, o_ref = _forward("gdn_cp", x), _forward("transformers", x)
    assert_close_scaled(
        o_ours, o_ref, torch.float32, terms=terms, msg="correctness gate: outputs differ from transformers':"
    )
    grads_ours = _forward_backward("gdn_cp", x, do)
    grads_ref = _forward_backward("transformers", x, do)
    for name, a, b in zip(("q", "k", "v", "g", "beta"), grads_ours, grads_ref, strict=True):
        msg = f"correctness gate: d{name} differs from transformers':"
        assert_close_scaled(a, b, torch.float32, terms=terms, msg=msg)
    return x, do


CASES = [
    pytest.param(
        T, pass_, impl, marks=pytest.mark.benchmark(group=f"T{T}-{pass_}"), id=f"T{T}-{pass_}-{impl}"
    )
    for T in (2048, 8192)
    for pass_ in ("fwd", "fwd+bwd")
    for impl in IMPLS
]


@pytest.mark.parametrize("T, pass_, impl", CASES)
def test_chunk_speed(benchmark: Any, T: int, pass_: str, impl: str) -> None:
    x, do = checked_inputs(T)
    benchmark.extra_info.update({"T": T, "pass": pass_, "impl": impl, "threads": torch.get_num_threads()})
    if pass_ == "fwd":
        benchmark.pedantic(_forward, args=(impl, x), rounds=ROUNDS[T, pass_], warmup_rounds=1)
    else:
        benchmark.pedantic(_forward_backward, args=(impl, x, do), rounds=ROUNDS[T, pass_], warmup_rounds=1)
