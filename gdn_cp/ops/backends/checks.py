"""The checks of a backend's op, one implementation for `bench doctor`'s kernels group (bench.doctor.kernels
builds its rows from these) and for `register_backend(..., check=True)` (`registration_check`):

- `op_check`: the op in the check's dtype on its device against the recurrent reference in fp64 on the
  host: output, final state and the gradients of q, k, v, g, beta and the initial state, on a batch of 2 and
  on packed documents (boundaries inside and at the edges of chunks, one of one token);
- `seam_check`: the summary modes' use of the op (gdn_cp.ops.affine_rule: one call at width V + K from
  [0 | I]): a shard of two segments, the second continuing the first's document, its [S | M] and its outputs
  finished with the state entering it, and the summary hook's [S | M] where the backend has one.

Bars follow from the dtype (`bar`). Where the op is off, `diagnose` names what it got wrong by comparing it
with the reference under each hypothesis (the recurrence is linear in the state, so each is exact):

    its outputs are the reference's from a zero state              it ignores initial_state
    they are the reference's from c x initial_state, c != 1        it scales initial_state
    outputs and final state right, no initial-state gradient       it detaches initial_state
    outputs right, the final state the reference's in [V, K] order it returns the final state transposed

else one line naming the worst tensor, its error and the bar. Each of these is silently wrong under CP (the
state entering a rank is an initial_state): gdn_cp.ops.backends.mutants makes each of them on purpose, to
prove that the checks catch it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.ops.affine import affine_rule
from gdn_cp.ops.backends.entry import Backend
from gdn_cp.ops.recurrent import recurrent_gated_delta_rule


@dataclass(frozen=True, slots=True)
class CheckSize:
    """The sizes of a check's inputs (shapes: gdn_cp.ops.backends.RuleOp)."""

    T: int
    Hk: int
    Hv: int
    K: int
    V: int
    documents: tuple[int, ...]
    """Packed documents of the T tokens (B = 1)."""
    seam_cut: int
    """The seam check's segments are [0, seam_cut) and [seam_cut, T), the second continuing the first."""
    batch: int = 2
    """B of the unpacked op check."""


DOCTOR = CheckSize(T=256, Hk=2, Hv=4, K=64, V=64, documents=(0, 37, 100, 101, 256), seam_cut=100)
"""`bench doctor`'s sizes: several chunks of every chunk size a backend takes, seconds on a CPU."""
REGISTRATION = CheckSize(T=48, Hk=1, Hv=2, K=16, V=16, documents=(0, 11, 27, 28, 48), seam_cut=20)
"""`register_backend`'s sizes: three chunks of 16 (the smallest FLA takes, and a Triton dot's least K),
K = V so that a transposed state keeps its shape; tens of milliseconds on a CPU."""
REGISTRATION_CHUNK = 16
"""The chunk size of the registration check, where the backend lists none."""
ROUNDING_FACTOR = 16.0
"""Bars are ROUNDING_FACTOR * u * sqrt(terms): rounding over one output's terms
(tests/gdn_cp/ops/helpers.py)."""
TF32_UNIT = 2.0**-11
"""TF32's unit roundoff (10 explicit mantissa bits): Triton's fp32 dots run in TF32 on a GPU by default."""
KW = {"use_qk_l2norm_in_kernel": True, "output_final_state": True}
"""The op's options in every check: the layer's (normalised keys), with final states."""
TENSORS = ("o", "final state", "dq", "dk", "dv", "dg", "dbeta", "d initial_state")
"""What the op check compares, in `_with_grads`' order."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One check of an op: its worst error against the reference, and what was wrong where it failed."""

    what: str
    """Which check: "op, batch 2", "op, packed documents" or "seam"."""
    error: float
    """The largest relative error (max |a - r| / max |r|) over its tensors; inf where one is missing."""
    tensor: str
    """The tensor at that error."""
    bar: float
    kind: str
    """What the bar assumes ("fp32", "tf32", ...)."""
    problem: str | None = None
    """What the op got wrong (a diagnosis, or the worst tensor against the bar); None: within the bar."""
    raised: Exception | None = None
    """What the call raised, if it did (then `problem` is its first line)."""

    @property
    def ok(self) -> bool:
        return self.problem is None


def bar(backend: Backend, device: torch.device, dtype: torch.dtype, size: CheckSize) -> tuple[float, str]:
    """(relative bar, what it assumes) of `backend`'s results in `dtype` on `device`: rounding over an
    output's T * K terms (fp32, fp64); TF32 rounding of each product's K terms where a Triton backend runs
    fp32 on a GPU (its dots round their inputs to TF32); a half dtype's rounding of each product's K terms
    (inputs rounded, sums kept in fp32)."""
    if dtype == torch.float32 and device.type != "cpu" and "triton" in backend.packages:
        return ROUNDING_FACTOR * TF32_UNIT * math.sqrt(size.K), "tf32"
    eps = torch.finfo(dtype).eps
    name = str(dtype).removeprefix("torch.")
    if eps > torch.finfo(torch.float32).eps:
        return ROUNDING_FACTOR * eps * math.sqrt(size.K), name
    return ROUNDING_FACTOR * eps * math.sqrt(size.T * size.K), name


def check_inputs(size: CheckSize, batch: int, seed: int = 0) -> list[torch.Tensor]:
    """(q, k, v, g, beta, h0) in fp64 on the host, h0 one state per row: decays and a state large enough
    that the state entering a sequence moves its outputs (a scaled or ignored state shows)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=gen, dtype=torch.float64)

    T, Hk, Hv, K, V = size.T, size.Hk, size.Hv, size.K, size.V
    g = torch.nn.functional.logsigmoid(randn(batch, T, Hv))
    beta = torch.sigmoid(randn(batch, T, Hv))
    return [
        randn(batch, T, Hk, K),
        randn(batch, T, Hk, K),
        randn(batch, T, Hv, V),
        g,
        beta,
        randn(batch, Hv, K, V),
    ]


def rel_error(actual: torch.Tensor | None, reference: torch.Tensor | None) -> float:
    """max |actual - reference| / max |reference|, in fp64 on the host; inf where one is missing, the
    shapes differ or actual is not finite."""
    if actual is None or reference is None or actual.shape != reference.shape:
        return math.inf
    a, r = (t.detach().to("cpu", torch.float64) for t in (actual, reference))
    if not torch.isfinite(a).all():
        return math.inf
    scale = max(r.abs().max().item() if r.numel() else 0.0, torch.finfo(torch.float64).tiny)
    return ((a - r).abs().max().item() if r.numel() else 0.0) / scale


def _errors(pairs: Sequence[tuple[str, torch.Tensor | None, torch.Tensor | None]]) -> list[tuple[float, str]]:
    return [(rel_error(actual, reference), name) for name, actual, reference in pairs]


def _off(errors: list[tuple[float, str]], limit: float, kind: str) -> str:
    """The first tensor above the bar, in order (an error in o runs into every gradient)."""
    error, tensor = next(e for e in errors if e[0] > limit)
    return f"{tensor} is off the fp64 reference by rel error {error:.1e}, above the bar {limit:.1e} ({kind})"


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


def _raised(what: str, exc: Exception, limit: float, kind: str) -> Outcome:
    line = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return Outcome(what, math.inf, "-", limit, kind, problem=line, raised=exc)


def op_check(
    backend: Backend,
    device: torch.device,
    *,
    dtype: torch.dtype = torch.float32,
    size: CheckSize = DOCTOR,
    chunk_size: int = 64,
) -> list[Outcome]:
    """The op in `dtype` on `device` vs the recurrent reference in fp64 on the host (module docstring), on a
    batch and on packed documents: one Outcome each (an exception the call raised is one too)."""
    limit, kind = bar(backend, device, dtype, size)
    out = []
    for what, batch, cu in (
        (f"op, batch {size.batch}", size.batch, None),
        ("op, packed documents", 1, size.documents),
    ):
        inputs = check_inputs(size, batch)
        if cu is not None:
            inputs[5] = inputs[5].repeat(len(cu) - 1, 1, 1, 1)

        def reference(q, k, v, g, beta, h0, cu=cu):
            cu_ = None if cu is None else torch.tensor(cu)
            return recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu_, **KW)

        def tested(q, k, v, g, beta, h0, cu=cu):
            return backend.rule(
                q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, chunk_size=chunk_size, **KW
            )

        expected = _with_grads(reference, inputs)
        try:
            got = _with_grads(tested, [t.to(device, dtype) for t in inputs])
        except Exception as exc:
            out.append(_raised(what, exc, limit, kind))
            continue
        errors = _errors(list(zip(TENSORS, got, expected, strict=True)))
        error, tensor = max(errors)
        problem = None
        if error > limit:
            with torch.no_grad():
                zero = reference(*inputs[:5], None)[0]
            problem = diagnose(got, expected, zero, limit) or _off(errors, limit, kind)
        out.append(Outcome(what, error, tensor, limit, kind, problem))
    return out


def diagnose(
    got: Sequence[torch.Tensor | None],
    expected: Sequence[torch.Tensor | None],
    zero: torch.Tensor,
    limit: float,
) -> str | None:
    """What an op got wrong with the initial state (module docstring), from its results and the reference's
    (in `_with_grads`' order: o, final state, dq, dk, dv, dg, dbeta, d initial_state) and the reference's
    output from a zero state; None: none of the hypotheses fits."""
    o, h, d_h0 = got[0], got[1], got[7]
    o_ref, h_ref, d_h0_ref = expected[0], expected[1], expected[7]
    assert o is not None and o_ref is not None and h_ref is not None and d_h0_ref is not None
    if rel_error(o, zero) <= limit:
        return "ignores initial_state: its outputs are the reference's from a zero state"
    a, r, z = (t.detach().to("cpu", torch.float64) for t in (o, o_ref, zero))
    direction = r - z
    if direction.square().sum() > 0:
        c = ((a - z) * direction).sum().item() / direction.square().sum().item()
        if abs(c - 1) > limit and rel_error(a, z + c * direction) <= limit:
            return f"scales initial_state by {c:.4g}: its outputs are the reference's from that multiple"
    if rel_error(o, o_ref) > limit:
        return None
    if rel_error(h, h_ref) <= limit and (d_h0 is None or not bool(d_h0.abs().max() > 0)):
        what = "no" if d_h0 is None else "a zero"
        return f"detaches initial_state: outputs and final state right, initial_state gets {what} gradient"
    transposed = None if h is None else h_ref.transpose(-1, -2).reshape(h.shape)
    if h is not None and h.numel() == h_ref.numel() and rel_error(h, transposed) <= limit:
        return "returns the final state transposed: [N, Hv, V, K] order where [N, Hv, K, V] is declared"
    return None


def seam_check(
    backend: Backend,
    device: torch.device,
    *,
    dtype: torch.dtype = torch.float32,
    size: CheckSize = DOCTOR,
    chunk_size: int = 64,
) -> Outcome:
    """The summary modes' use of the op (module docstring) vs the recurrent reference over the whole shard in
    fp64; with a summary hook, its [S | M] of the second segment too."""
    limit, kind = bar(backend, device, dtype, size)
    q, k, v, g, beta, h0 = check_inputs(size, 1)
    o_ref, h_ref = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, **KW)
    cut, K = size.seam_cut, size.K
    _, h_cut = recurrent_gated_delta_rule(*(t[:, :cut] for t in (q, k, v, g, beta)), initial_state=h0, **KW)
    acc = accumulation_dtype(dtype)
    try:
        moved = [t.to(device, dtype) for t in (q, k, v, g, beta)]
        found = affine_rule(
            backend,
            *moved,
            bounds=[0, cut, size.T],
            carried=[False, True],
            fresh_states=h0.to(device, acc).unsqueeze(1).expand(-1, 2, -1, -1, -1),
            finals=True,
            chunk_size=chunk_size,
            use_qk_l2norm_in_kernel=True,
        )
        summary = found.summary(1).double().cpu()
        o, finals = found.with_entering_states(h_cut.to(device, acc).unsqueeze(1), True)
        hooked = None
        if backend.summary is not None:
            maps = backend.summarise(
                *(t[:, cut:] for t in moved), chunk_size=chunk_size, use_qk_l2norm_in_kernel=True
            )
            hooked = maps.double().cpu()
    except Exception as exc:
        return _raised("seam", exc, limit, kind)
    assert finals is not None
    S, M = summary[..., :-K], summary[..., -K:]
    pairs = [
        ("o", o, o_ref),
        ("first segment's final state", finals[:, 0], h_cut),
        ("[S | M] applied to H_in", S + M @ h_cut, h_ref),  # the map carries the state across segment 2
        ("final state", finals[:, 1], h_ref),
    ]
    if hooked is not None:
        pairs.append(("summary hook's [S | M]", hooked[..., :-K] + hooked[..., -K:] @ h_cut, h_ref))
    errors = _errors(pairs)
    error, tensor = max(errors)
    problem = None
    if error > limit:
        seam = "through the seam (one call at width V + K from [0 | I], gdn_cp.ops.affine_rule)"
        problem = f"{seam}, {_off(errors, limit, kind)}"
    return Outcome("seam", error, tensor, limit, kind, problem)


def registration_check(backend: Backend) -> str:
    """`register_backend`'s check of a new entry (op_check and seam_check at REGISTRATION's sizes, on the CPU
    in fp32 where it runs there, else on the first of its devices this process already uses, in fp32 or its
    first dtype): what it found, for the entry's `checked`; "not checked: <why>" where it cannot run here.
    ValueError, one line naming what the op got wrong, where a check fails."""
    where = check_device(backend)
    if isinstance(where, str):
        return f"not checked: {where}"
    device, dtype, chunk_size = where
    kw = {"dtype": dtype, "size": REGISTRATION, "chunk_size": chunk_size}
    outcomes = [*op_check(backend, device, **kw), seam_check(backend, device, **kw)]
    on = f"{device.type} {str(dtype).removeprefix('torch.')}"
    for outcome in outcomes:
        if outcome.raised is not None and isinstance(outcome.raised, ValueError):
            line = (outcome.problem or "").removeprefix("ValueError: ")
            raise ValueError(f"{line} (register_backend's check, {on})")
        if outcome.raised is not None:
            raise ValueError(
                f"backend {backend.name!r}'s op raised {outcome.problem} in register_backend's check "
                f"({outcome.what}, {on}): an op of gdn_cp.ops.backends.RuleOp's signature, or say what it "
                "takes (devices, dtypes, chunk_sizes, ...)"
            )
        if not outcome.ok:
            raise ValueError(
                f"backend {backend.name!r} {outcome.problem} (register_backend's check, {outcome.what}, {on})"
            )
    worst = max(outcomes, key=lambda o: o.error / o.bar)
    return (
        f"checked on {on}: op and seam within the bar of the fp64 reference (worst rel error "
        f"{worst.error:.1e}, bar {worst.bar:.1e})"
    )


def check_device(backend: Backend) -> tuple[torch.device, torch.dtype, int] | str:
    """(device, dtype, chunk size) for `registration_check`: the CPU where the backend runs there, else the
    first of its device types this process already uses; fp32 where it takes it, else its first dtype. Why
    it cannot be checked here, otherwise."""
    kinds = ["cpu"] if backend.devices is None else sorted(backend.devices, key=lambda kind: kind != "cpu")
    dtype = torch.float32 if torch.float32 in backend.dtypes else backend.dtypes[0]
    chunk_size = REGISTRATION_CHUNK if backend.chunk_sizes is None else min(backend.chunk_sizes)
    unused, refused = [], []
    for kind in kinds:
        if not _in_use(kind):
            unused.append(kind)
            continue
        try:
            backend.check(device=kind, dtype=dtype, chunk_size=chunk_size, head_k_dim=REGISTRATION.K)
        except ValueError as exc:
            refused.append(str(exc).splitlines()[0])
            continue
        return torch.device(kind), dtype, chunk_size
    if unused:
        refused.append(
            f"it runs on {' or '.join(unused)}, which this process has not initialised (the check creates "
            "no device context: register it after the process first uses the device, or let bench doctor "
            "check it)"
        )
    return "; ".join(refused)


def _in_use(kind: str) -> bool:
    """Whether this process already uses a device of type `kind` (torch.<kind>.is_initialized(): cuda, npu
    with torch_npu imported, ...), asked without creating a context: a process that has none must not get
    one from a registration (bench's launcher imports the modules that register, and holds no device
    context; bench.launch.devices)."""
    if kind == "cpu":
        return True
    initialized = getattr(getattr(torch, kind, None), "is_initialized", None)
    return bool(initialized()) if callable(initialized) else False
