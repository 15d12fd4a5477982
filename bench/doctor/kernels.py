"""The kernels group of `bench doctor`: every registered local-op backend (gdn_cp.ops.backends) that can run
on this device, checked the way the CP modes use it. Per backend: its versions; its op in fp32 against the
recurrent reference in fp64 on the host (unpacked and packed documents, gradients of every input and of the
initial state); the seam of the summary modes (one call at width V + K: the packed [S | M] and
o = o_free + q_eff @ H_in, gdn_cp.ops.affine_rule) against the same reference; and, where the device is not a
CPU, the time of a forward+backward beside the default backend at gpu-smoke's per-head shape. A backend that
cannot run here (not installed, a device or dtype it does not take, kernels that would be interpreted) gets
one info line saying why. The layer group (bench.doctor.rank) runs every mode with each usable backend.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import torch

from bench.doctor.checks import Check, Status
from gdn_cp.accuracy import error_stats
from gdn_cp.ops import (
    DEFAULT_BACKEND,
    Backend,
    affine_rule,
    backend_names,
    get_backend,
    recurrent_gated_delta_rule,
)

SHAPE = {"B": 1, "T": 256, "Hk": 2, "Hv": 4, "K": 64, "V": 64}
"""The kernel checks' inputs: several chunks of every chunk size a backend takes, seconds on a CPU."""
DOCUMENTS = [0, 37, 100, 101, 256]
"""Packed documents: boundaries inside and at the edges of chunks, one of one token."""
SEAM_BOUNDS = [0, 100, 256]
"""The seam check's two segments: the second continues the first's document (it enters with [0 | I])."""
CHUNK_SIZE = 64
ROUNDING_FACTOR = 16.0
"""Bars are ROUNDING_FACTOR * u * sqrt(terms): rounding over one output's terms (tests/ops/helpers.py)."""
TF32_UNIT = 2.0**-11
"""TF32's unit roundoff (10 explicit mantissa bits): Triton's fp32 dots run in TF32 on a GPU by default."""
TIMED_SHAPE = {"B": 1, "T": 8192, "Hk": 16, "Hv": 32, "K": 128, "V": 128}
"""gpu-smoke's per-rank shape at 8K tokens (the reference PR's model sizes), bf16."""
TIMED_REPEAT = 5
KW = {"use_qk_l2norm_in_kernel": True, "output_final_state": True}
"""The op's options in every check: the layer's (normalised keys), with final states."""


def bar(backend: Backend, device: torch.device) -> tuple[float, str]:
    """(relative bar, what it assumes) of `backend`'s fp32 results on `device`: fp32 rounding over an
    output's T * K terms, or TF32 rounding of each product's K terms where a Triton backend runs on a GPU
    (its fp32 dots round their inputs to TF32)."""
    if device.type != "cpu" and "triton" in backend.packages:
        return ROUNDING_FACTOR * TF32_UNIT * math.sqrt(SHAPE["K"]), "tf32"
    return ROUNDING_FACTOR * torch.finfo(torch.float32).eps * math.sqrt(SHAPE["T"] * SHAPE["K"]), "fp32"


def usable(backend: Backend, device: torch.device) -> str | None:
    """Why `backend` is not checked on `device` (None: it is): it cannot run there in fp32 at CHUNK_SIZE,
    its package does not import, or its kernels would run in an interpreter (tests/fla_kernels checks
    those)."""
    try:
        backend.check(device=device, dtype=torch.float32, chunk_size=CHUNK_SIZE, head_k_dim=SHAPE["K"])
        if backend.interpreted():
            return "its kernels would run in Triton's interpreter here: tests/fla_kernels checks them"
        missing = backend.unavailable()  # found on the path first: one line naming the module
        if missing is not None:
            return missing
        backend.op()  # on a rank: importing the kernels here is the check (it may query this rank's device)
    except (ValueError, ImportError) as exc:
        return str(exc).splitlines()[0]
    return None


def _inputs(shape: dict[str, int], dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """(q, k, v, g, beta, h0) on the host (shapes: gdn_cp.ops), h0 one state per row."""
    gen = torch.Generator().manual_seed(seed)
    B, T, Hk, Hv, K, V = (shape[x] for x in ("B", "T", "Hk", "Hv", "K", "V"))

    def randn(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=gen, dtype=torch.float64)

    g = torch.nn.functional.logsigmoid(randn(B, T, Hv))
    beta = torch.sigmoid(randn(B, T, Hv))
    inputs = [randn(B, T, Hk, K), randn(B, T, Hk, K), randn(B, T, Hv, V), g, beta, 0.1 * randn(B, Hv, K, V)]
    return [t.to(dtype) for t in inputs]


def _worst(pairs: Iterator[tuple[torch.Tensor | None, torch.Tensor | None]]) -> float:
    """The largest rel_max over (actual, reference) pairs; inf where one side is missing."""
    worst = 0.0
    for actual, reference in pairs:
        if actual is None or reference is None:
            return math.inf
        stats = error_stats(actual, reference)
        worst = max(worst, stats.rel_max if stats.finite else math.inf)
    return worst


def _with_grads(
    run: Callable[..., tuple[torch.Tensor, torch.Tensor]], inputs: list[torch.Tensor]
) -> list[torch.Tensor | None]:
    """run(*inputs)'s (o, final state) and the gradients of every input under a fixed random weighting."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    o, h = run(*leaves)
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t) for t in (o, h)]
    ((o * weights[0]).sum() + (h * weights[1]).sum()).backward()
    return [o.detach(), h.detach(), *(t.grad for t in leaves)]


def op_check(backend: Backend, device: torch.device) -> list[Check]:
    """The op in fp32 on the device vs the recurrent reference in fp64 on the host: output, final state and
    the gradients of q, k, v, g, beta and the initial state; unpacked (batch 2) and packed documents."""
    limit, kind = bar(backend, device)
    out = []
    for label, shape, cu in (
        ("batch 2", {**SHAPE, "B": 2}, None),
        ("packed documents", SHAPE, DOCUMENTS),
    ):
        inputs = _inputs(shape, torch.float64)
        if cu is not None:
            inputs[5] = inputs[5].repeat(len(cu) - 1, 1, 1, 1)

        def reference(q, k, v, g, beta, h0, cu=cu):
            cu_ = None if cu is None else torch.tensor(cu)
            return recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu_, **KW)

        def tested(q, k, v, g, beta, h0, cu=cu):
            return backend.rule(
                q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, chunk_size=CHUNK_SIZE, **KW
            )

        expected = _with_grads(reference, inputs)
        moved = [t.to(device, torch.float32) for t in inputs]
        try:
            got = _with_grads(tested, moved)
        except Exception as exc:
            out.append(_failed(backend, f"op, {label}", exc))
            continue
        worst = _worst(zip(got, expected, strict=True))
        status: Status = "ok" if worst <= limit else "fail"
        detail = f"output, state, 6 grads vs fp64 reference: rel error {worst:.1e} (bar {limit:.1e}, {kind})"
        out.append(Check("kernels", f"{backend.name} op, {label}", status, detail))
    return out


def seam_check(backend: Backend, device: torch.device) -> Check:
    """The summary modes' use of the op (gdn_cp.ops.affine_rule): a shard of two segments, the second
    continuing the first's document, called once at width V + K; its [S | M] and its outputs finished with
    the state entering it, vs the recurrent reference over the whole shard in fp64."""
    limit, kind = bar(backend, device)
    q, k, v, g, beta, h0 = _inputs(SHAPE, torch.float64)
    o_ref, h_ref = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, **KW)
    cut = SEAM_BOUNDS[1]
    _, h_cut = recurrent_gated_delta_rule(*(t[:, :cut] for t in (q, k, v, g, beta)), initial_state=h0, **KW)
    try:
        moved = [t.to(device, torch.float32) for t in (q, k, v, g, beta)]
        found = affine_rule(
            backend,
            *moved,
            bounds=SEAM_BOUNDS,
            carried=[False, True],
            fresh_states=h0.to(device, torch.float32).unsqueeze(1).expand(-1, 2, -1, -1, -1),
            finals=True,
            chunk_size=CHUNK_SIZE,
            use_qk_l2norm_in_kernel=True,
        )
        summary = found.summary(1)
        K = SHAPE["K"]
        S, M = summary[..., :-K].double().cpu(), summary[..., -K:].double().cpu()
        o, finals = found.with_entering_states(h_cut.to(device, torch.float32).unsqueeze(1), True)
    except Exception as exc:
        return _failed(backend, "seam", exc)
    assert finals is not None
    worst = _worst(
        iter(
            [
                (o, o_ref),
                (finals[:, 0], h_cut),
                (S + M @ h_cut, h_ref),  # the map carries the state across the second segment
                (finals[:, 1], h_ref),
            ]
        )
    )
    status: Status = "ok" if worst <= limit else "fail"
    detail = (
        f"[S | M], o_free + q_eff H_in vs fp64 reference: rel error {worst:.1e} (bar {limit:.1e}, {kind})"
    )
    return Check("kernels", f"{backend.name} seam", status, detail)


def _forward_backward_ms(
    backend: Backend, inputs: list[torch.Tensor], synchronize: Callable[[], None]
) -> float:
    """Median milliseconds of one forward+backward of `backend` on `inputs` (after one warm-up, which also
    autotunes)."""
    leaves = [t.detach().requires_grad_(True) for t in inputs[:5]]
    times = []
    for _ in range(TIMED_REPEAT + 1):
        synchronize()
        start = time.perf_counter()
        o, _ = backend.rule(*leaves, **KW, chunk_size=CHUNK_SIZE)
        o.sum().backward()
        synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times[1:])[TIMED_REPEAT // 2]


def timing_check(backend: Backend, device: torch.device, synchronize: Callable[[], None]) -> Check:
    """Info: `backend`'s forward+backward beside the default backend's at TIMED_SHAPE, bf16 (the eager op
    launches a few kernels per chunk; a fused one, a few per call)."""
    inputs = [t.to(device) for t in _inputs(TIMED_SHAPE, torch.bfloat16)]
    try:
        ms = _forward_backward_ms(backend, inputs, synchronize)
        base = _forward_backward_ms(get_backend(DEFAULT_BACKEND), inputs, synchronize)
    except Exception as exc:
        return _failed(backend, "time", exc)
    shape = "x".join(str(TIMED_SHAPE[x]) for x in ("T", "Hv", "K"))
    detail = (
        f"forward+backward {ms:.1f} ms vs {DEFAULT_BACKEND} {base:.1f} ms ({base / ms:.1f}x), "
        f"T x Hv x K {shape} bf16"
    )
    return Check("kernels", f"{backend.name} time", "info", detail)


def _failed(backend: Backend, what: str, exc: Exception) -> Check:
    detail = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return Check("kernels", f"{backend.name} {what}", "fail", detail)


def kernel_checks(device: torch.device, synchronize: Callable[[], None]) -> list[Check]:
    """The kernels group on `device` (module docstring), every registered backend in registry order."""
    out = []
    for name in backend_names():
        backend = get_backend(name)
        versions = ", ".join(f"{p} {v}" for p, v in backend.versions().items())
        why_not = usable(backend, device)
        if why_not is not None:
            detail = f"not checked: {why_not}" + (f" ({versions})" if versions else "")
            out.append(Check("kernels", name, "info", detail))
            continue
        detail = backend.description + (f"; {versions}" if versions else "")
        out.append(Check("kernels", name, "info", detail))
        out += op_check(backend, device)
        out.append(seam_check(backend, device))
        if device.type != "cpu" and name != DEFAULT_BACKEND:
            out.append(timing_check(backend, device, synchronize))
    return out


def layer_backends(device: torch.device) -> list[str]:
    """The non-default backends the layer group runs every mode with: those `kernel_checks` checks."""
    return [n for n in backend_names() if n != DEFAULT_BACKEND and usable(get_backend(n), device) is None]
