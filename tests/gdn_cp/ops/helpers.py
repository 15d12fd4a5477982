"""Input builders and measuring tools shared by the tests of gdn_cp.ops (shapes: see gdn_cp.ops), and the
tolerance rule of all the tests: `tolerance`, `assert_close_scaled` (elsewhere: from
tests.gdn_cp.ops.helpers)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gdn_cp.ops import recurrent_gated_delta_rule


@dataclass(frozen=True)
class Shape:
    """Sizes of one GDN problem; `id` is the readable pytest id, e.g. B1-T64-Hk2-Hv4-K16-V8."""

    B: int
    T: int
    Hk: int
    Hv: int
    K: int
    V: int

    @property
    def id(self) -> str:
        return f"B{self.B}-T{self.T}-Hk{self.Hk}-Hv{self.Hv}-K{self.K}-V{self.V}"

    @property
    def state(self) -> tuple[int, int, int, int]:
        return (self.B, self.Hv, self.K, self.V)


class GDNInputs(NamedTuple):
    """(q, k, v, g, beta) in the argument order of every op; `*inputs` passes them positionally."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    def to(self, dtype: torch.dtype) -> GDNInputs:
        return GDNInputs(*(x.detach().to(dtype) for x in self))

    def requires_grad_(self) -> GDNInputs:
        for x in self:
            x.requires_grad_()
        return self

    def slice(self, start: int, stop: int) -> GDNInputs:
        """Tokens [start, stop) of the sequence."""
        return GDNInputs(*(x[:, start:stop] for x in self))


def gdn_inputs(
    shape: Shape,
    *,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    unit_qk: bool = False,
    requires_grad: bool = False,
) -> GDNInputs:
    """Realistic inputs: g = logsigmoid(randn) <= 0, beta = sigmoid(randn) in (0, 1).

    unit_qk: L2-normalise q and k here, as a caller of an op with use_qk_l2norm_in_kernel=False does;
    raw randn keys with beta |k|^2 >> 2 make the delta rule diverge exponentially.
    """
    gen = torch.Generator().manual_seed(seed)
    s = shape

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, dtype=torch.float64)

    q, k = randn(s.B, s.T, s.Hk, s.K), randn(s.B, s.T, s.Hk, s.K)
    if unit_qk:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = randn(s.B, s.T, s.Hv, s.V)
    g = F.logsigmoid(randn(s.B, s.T, s.Hv))
    beta = torch.sigmoid(randn(s.B, s.T, s.Hv))
    inputs = GDNInputs(q, k, v, g, beta).to(dtype)
    return inputs.requires_grad_() if requires_grad else inputs


def random_state(shape: Shape, *, dtype: torch.dtype = torch.float64, seed: int = 1) -> torch.Tensor:
    """A random recurrent state [B, Hv, K, V], of the size a real state reaches (entries ~ 0.5)."""
    gen = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(*shape.state, generator=gen, dtype=torch.float64)).to(dtype)


TINY = 1e-30
"""Floor of a reference's scale: an all-zero reference is matched only by an (almost) all-zero result."""

ROUNDING_FACTOR = 16.0
"""The constant c of `tolerance`: a few units of roundoff per accumulated term, with room for cancellation
(a result smaller than the terms it is the difference of) and for the summation orders and kernels that
differ between x86 CPUs (SIMD width, BLAS blocking, Intel or AMD code paths)."""


def relative_max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|: a scale-aware error for low-precision outputs."""
    if expected.numel() == 0:
        return 0.0
    expected = expected.double()
    scale = expected.abs().max().clamp_min(TINY)
    return ((actual.double() - expected).abs().max() / scale).item()


def tolerance(dtype: torch.dtype, *, terms: int = 1, factor: float = ROUNDING_FACTOR) -> float:
    """Relative error bound c * eps(dtype) * sqrt(terms) for a result computed in `dtype`.

    eps is the dtype's machine epsilon (2x its unit roundoff); terms is the accumulation length / depth
    of the computation (summed terms, tokens carried through the state, chunks): rounding errors of
    independent terms add up like a random walk. CPUs differ only in the last bits of each operation, so
    a bound built this way holds on any of them, while it stays far below a real bug's error (in fp32,
    c = 16 and terms = 10^4 give 1.9e-4).
    """
    return factor * torch.finfo(dtype).eps * math.sqrt(max(terms, 1))


def assert_close_scaled(
    actual: torch.Tensor,
    expected: torch.Tensor,
    dtype: torch.dtype,
    *,
    terms: int = 1,
    factor: float = ROUNDING_FACTOR,
    elementwise: bool = False,
    check_dtype: bool = True,
    msg: str = "",
) -> None:
    """max |actual - expected| <= tolerance(dtype, terms, factor) * max(max |expected|, TINY).

    The error is measured on the reference's own scale (its abs-max), as rounding errors are relative:
    no absolute tolerance fitted to one machine's output. elementwise=True scales every element by its
    own |expected| instead (for elementwise formulas, whose relative error is small everywhere).
    dtype is the precision the result was computed in (not necessarily the tensors' dtype: a bf16 output
    may be compared in fp64). Shapes must match, dtypes too unless check_dtype=False.
    """
    assert actual.shape == expected.shape, f"{msg} shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if check_dtype:
        assert actual.dtype == expected.dtype, f"{msg} dtype {actual.dtype} != {expected.dtype}"
    bound = tolerance(dtype, terms=terms, factor=factor)
    a, e = actual.detach().double(), expected.detach().double()
    if not elementwise:
        err = relative_max_error(a, e)
    else:
        err = ((a - e).abs() / e.abs().clamp_min(TINY)).max().item() if e.numel() else 0.0
    assert err <= bound, (  # NaN fails too
        f"{msg} relative error {err:.3e} > {bound:.3e} = {factor:g} eps({dtype}) sqrt({terms})"
        f"{' elementwise' if elementwise else ' of max |expected|'}"
    )


@contextmanager
def saved_tensor_bytes() -> Iterator[list[int]]:
    """Sum of the bytes of every tensor autograd saves for backward inside the block (in `[0]`).

    Tensors saved twice count twice: this measures what the graph holds on to, deterministically.
    """
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total


class _ElementsWritten(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.elements += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return out


def backward_elements_written(loss: torch.Tensor) -> int:
    """Total elements of all tensors produced by the aten ops that `loss.backward()` runs.

    A deterministic measure of backward work: per-chunk index writes into a whole-sequence tensor
    (CopySlices) make every chunk's backward clone the full gradient, which shows up here as
    quadratic growth in T, while it stays invisible to node counts and saved bytes.
    """
    mode = _ElementsWritten()
    with mode:
        loss.backward()
    return mode.elements


def weighted_sum(*tensors: torch.Tensor | None, seed: int = 7) -> torch.Tensor:
    """sum_i <t_i, r_i> with fixed random r_i: a loss whose gradient differs for every output entry."""
    gen = torch.Generator().manual_seed(seed)
    loss = torch.zeros((), dtype=torch.float64)
    for t in tensors:
        if t is not None:
            r = torch.randn(t.shape, generator=gen, dtype=torch.float64)
            loss = loss + (t.double() * r).sum()
    return loss


# -- two pieces through a summaries-then-outputs pair (tests/gdn_cp/ops/test_summarised_chunks.py,
# tests/fla_kernels)


def segments_of(starts: list[int], lo: int, hi: int) -> tuple[list[int], list[bool], list[int]]:
    """Piece [lo, hi) of a sequence with documents starting at `starts`: (its segments' bounds, local; which
    continue a document, the first piece's first one entering with a given state; each one's document)."""
    cuts = [lo, *(s for s in starts if lo < s < hi), hi]
    docs = [sum(s <= a for s in starts) for a in cuts[:-1]]
    carried = [a not in starts and (a != 0) for a in cuts[:-1]]
    carried[0] = carried[0] or lo == 0  # the first piece enters with the given state h_e
    return [c - lo for c in cuts], carried, docs


def reference(x, starts, h_e, fresh, T):
    """Per document on the recurrent reference: the first from h_e, the others from their fresh state."""
    outs, finals = [], []
    for d, (lo, hi) in enumerate(pairwise([0, *starts, T])):
        o, final = recurrent_gated_delta_rule(
            *(t[:, lo:hi] for t in x),
            initial_state=h_e if d == 0 else fresh[:, d],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        outs.append(o)
        finals.append(final)
    return torch.cat(outs, dim=1), torch.stack(finals, dim=1)


def two_pieces(rule, x, starts, h_e, fresh, pieces, **kw):
    """The pieces through a summaries-then-outputs pair (gdn_cp.ops.backends.KCPRule), each entering with
    M h + S of the one before (the exchange): the outputs, and each document's final state."""
    outs, finals, docs, entering, V = [], [], [], h_e, x[2].shape[-1]
    for i, (lo, hi) in enumerate(pieces):
        bounds, carried, piece_docs = segments_of(starts, lo, hi)
        summarise = [len(carried) - 1] if i < len(pieces) - 1 else []
        part = rule(
            *(t[:, lo:hi] for t in x),
            cu_seqlens=bounds,
            carried=carried,
            summarised=summarise,
            fresh_state=fresh[:, piece_docs],
            **kw,
        )
        h = entering[:, None].expand(-1, len(carried), -1, -1, -1)
        o, final = part.with_entering_states(h, output_final_state=True)
        outs.append(o)
        finals.extend(final.unbind(1))
        docs.extend(piece_docs)
        if summarise:
            S, M = part.summaries[:, 0, ..., :V], part.summaries[:, 0, ..., V:]
            assert not carried[-1] or M.abs().max() > 0
            entering = M @ entering.to(M.dtype) + S  # the exchange: H_in of the next piece
    per_document = dict(zip(docs, finals, strict=True))  # a document's last segment's
    return torch.cat(outs, dim=1), torch.stack([per_document[d] for d in sorted(per_document)], dim=1)


def two_pieces_against_reference(rule, shape, starts, dtype, pieces, **kw):
    """[reference, the pair] (gdn_cp.ops.backends.KCPRule) on one sequence of `shape` with documents starting
    at `starts`, cut into `pieces`: each a list of o, finals and the gradients (of the first piece's entering
    state, the documents' initial states, q, k, v, g, beta) of one weighted loss (PAIR_NAMES)."""
    results = []
    for how in ("reference", "pair"):
        dt = torch.float64 if how == "reference" else dtype
        x = [t.to(dt).requires_grad_(True) for t in gdn_inputs(shape, seed=4)]
        gen = torch.Generator().manual_seed(5)
        h_e = 0.5 * torch.randn(*shape.state, generator=gen, dtype=torch.float64)
        n = len(starts) + 1
        fresh = 0.5 * torch.randn(shape.B, n, shape.Hv, shape.K, shape.V, generator=gen, dtype=torch.float64)
        h_e, fresh = h_e.to(dt).requires_grad_(True), fresh.to(dt).requires_grad_(True)
        if how == "reference":
            o, finals = reference(x, starts, h_e, fresh, shape.T)
        else:
            o, finals = two_pieces(rule, x, starts, h_e, fresh, pieces, **kw)
        weighted_sum(o, finals).backward()
        results.append([o, finals, h_e.grad, fresh.grad, *(t.grad for t in x)])
    return results


PAIR_NAMES = ["o", "finals", "d_entering", "d_fresh", "dq", "dk", "dv", "dg", "dbeta"]
