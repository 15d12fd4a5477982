"""The kernels group of `bench doctor`: every registered local-op backend (gdn_cp.ops.backends) that can run
on this device, checked the way the CP modes use it. Per backend: its versions and what its registration's
check found; its op in fp32 against the recurrent reference in fp64 on the host (unpacked and packed
documents, gradients of every input and of the initial state) and the seam of the summary modes (one call at
width V + K: the packed [S | M] and o = o_free + q_eff @ H_in, gdn_cp.ops.affine_rule) against the same
reference, both gdn_cp.ops.backends.checks (the checks register_backend runs, at larger sizes here); the power
of those checks: each of the op's built-in mutants (gdn_cp.ops.backends.mutants: initial_state ignored,
detached, scaled, the final state transposed) through them at register_backend's sizes, a mutant not caught a
failure (the checks could not have seen that bug), a warning where the bar is TF32's (a 1% state error stays
under it); and, where the device is not a CPU, the time of a
forward+backward beside the default backend at gpu-smoke's per-head shape. A backend that cannot run here (not
installed, a device or dtype it does not take, kernels that would be interpreted) gets one info line saying
why. The layer group (bench.doctor.rank) runs every mode with each usable backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bench.doctor.checks import Check
from gdn_cp.ops import DEFAULT_BACKEND, Backend, backend_names, get_backend
from gdn_cp.ops.backends import checks, mutants
from gdn_cp.ops.backends.checks import DOCTOR, REGISTRATION, ROUNDING_FACTOR, CheckSize, Outcome

__all__ = ["ROUNDING_FACTOR", "kernel_checks", "layer_backends", "usable"]

CHUNK_SIZE = 64
TIMED = CheckSize(T=8192, Hk=16, Hv=32, K=128, V=128, documents=(0, 8192), seam_cut=4096, batch=1)
"""gpu-smoke's per-rank shape at 8K tokens (the reference PR's model sizes), bf16."""
TIMED_REPEAT = 5
KW = checks.KW


def usable(backend: Backend, device: torch.device) -> str | None:
    """Why `backend` is not checked on `device` (None: it is): it cannot run there in fp32 at CHUNK_SIZE,
    its package does not import, or its kernels would run in an interpreter (tests/fla_kernels checks
    those)."""
    try:
        backend.check(device=device, dtype=torch.float32, chunk_size=CHUNK_SIZE, head_k_dim=DOCTOR.K)
        if backend.interpreted():
            return "its kernels would run in Triton's interpreter here: tests/fla_kernels checks them"
        missing = backend.unavailable()  # found on the path first: one line naming the module
        if missing is not None:
            return missing
        backend.op()  # on a rank: importing the kernels here is the check (it may query this rank's device)
    except (ValueError, ImportError) as exc:
        return str(exc).splitlines()[0]
    return None


def _row(backend: Backend, outcome: Outcome) -> Check:
    """A Check row of one of gdn_cp.ops.backends.checks' outcomes."""
    name = f"{backend.name} {outcome.what}"
    if outcome.raised is not None:
        return Check("kernels", name, "fail", outcome.problem or type(outcome.raised).__name__)
    compared = "output, state, 6 grads" if outcome.what.startswith("op") else "[S | M], o_free + q_eff H_in"
    measured = f"rel error {outcome.error:.1e} (bar {outcome.bar:.1e}, {outcome.kind})"
    if outcome.ok:
        return Check("kernels", name, "ok", f"{compared} vs fp64 reference: {measured}")
    return Check("kernels", name, "fail", f"{outcome.problem}; {compared}: {measured}")


def op_check(backend: Backend, device: torch.device) -> list[Check]:
    """The op in fp32 on the device vs the recurrent reference in fp64 on the host (checks.op_check)."""
    return [_row(backend, o) for o in checks.op_check(backend, device, size=DOCTOR, chunk_size=CHUNK_SIZE)]


def seam_check(backend: Backend, device: torch.device) -> Check:
    """The summary modes' use of the op vs the same reference (checks.seam_check)."""
    return _row(backend, checks.seam_check(backend, device, size=DOCTOR, chunk_size=CHUNK_SIZE))


def mutant_power(backend: Backend, device: torch.device) -> Check:
    """The op and seam checks, at register_backend's sizes, on each of the op's mutants
    (gdn_cp.ops.backends.mutants, the registry's entry swapped in turn): ok when every mutant fails them;
    a mutant that passes is a failure (the checks have no power against that bug here)."""
    chunk_size = CHUNK_SIZE if backend.chunk_sizes is None else min(backend.chunk_sizes)
    missed, how, blunt = [], [], set()
    for mutant in mutants.MUTANTS:
        with mutants.mutated(backend.name, mutant.name) as entry:
            kw = {"size": REGISTRATION, "chunk_size": chunk_size}
            found = [*checks.op_check(entry, device, **kw), checks.seam_check(entry, device, **kw)]
        failed = [o for o in found if not o.ok]
        if failed:
            how.append(f"{mutant.name} by {failed[0].what}")
        else:
            missed.append(mutant.description)
            blunt |= {f"{o.kind} bar {o.bar:.1e}" for o in found if o.kind == "tf32"}
    caught = f"{len(mutants.MUTANTS) - len(missed)}/{len(mutants.MUTANTS)} caught"
    if missed:
        detail = f"{caught}; not caught: {', '.join(missed)}: the op checks have no power against it here"
        if blunt:
            # TF32 dots round each product to ~1e-3: a 1% state error stays under a bar fit for them, so the
            # miss is the precision's limit, not a check that could have seen it (the fp32 CPU run does)
            bars = ", ".join(sorted(blunt))
            return Check("kernels", f"{backend.name} mutants", "warn", f"{detail} ({bars})")
        return Check("kernels", f"{backend.name} mutants", "fail", detail)
    return Check("kernels", f"{backend.name} mutants", "ok", f"{caught} ({'; '.join(how)})")


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
    """Info: `backend`'s forward+backward beside the default backend's at TIMED, bf16 (the eager op
    launches a few kernels per chunk; a fused one, a few per call)."""
    inputs = [t.to(device, torch.bfloat16) for t in checks.check_inputs(TIMED, TIMED.batch)[:5]]
    try:
        ms = _forward_backward_ms(backend, inputs, synchronize)
        base = _forward_backward_ms(get_backend(DEFAULT_BACKEND), inputs, synchronize)
    except Exception as exc:
        return _failed(backend, "time", exc)
    shape = f"{TIMED.T}x{TIMED.Hv}x{TIMED.K}"
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
        detail = (
            backend.description + (f"; {versions}" if versions else "") + f"; registration: {backend.checked}"
        )
        out.append(Check("kernels", name, "info", detail))
        out += op_check(backend, device)
        out.append(seam_check(backend, device))
        out.append(mutant_power(backend, device))
        if device.type != "cpu" and name != DEFAULT_BACKEND:
            out.append(timing_check(backend, device, synchronize))
    return out


def layer_backends(device: torch.device) -> list[str]:
    """The non-default backends the layer group runs every mode with: those `kernel_checks` checks."""
    return [n for n in backend_names() if n != DEFAULT_BACKEND and usable(get_backend(n), device) is None]
