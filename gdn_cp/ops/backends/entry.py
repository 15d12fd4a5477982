"""What a backend is: the op's signature (`RuleOp`, FLA's, declared here once), the hooks a backend may bring
(`SummaryOp`, `KCPRule`), and `Backend`, one entry: what its op supports and `rule`, the seam every CP mode
calls (the call checked against the entry, adapted to what the op takes, the op called, what it returned
checked: gdn_cp.ops.backends.returned).

Each backend module declares its entry with these (native.py, fla.py, torch_fallback.py); the registry
(registry.py) holds them.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Protocol

import torch

from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.ops.backends.findable import module_findable
from gdn_cp.ops.backends.returned import checked_maps, checked_result
from gdn_cp.ops.documents import check_packed_batch, document_bounds
from gdn_cp.ops.ran import op_called

DEFAULT_BACKEND = "gdn_cp"
"""The backend every op, layer and CP mode uses unless told otherwise: this package's chunked op."""


class RuleOp(Protocol):
    """The local op: flash-linear-attention's `chunk_gated_delta_rule` signature, the one declaration of it
    (every op, backend and CP surface of gdn_cp takes these arguments in this order and refers here).

        op(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
           use_qk_l2norm_in_kernel=False[, chunk_size=C]) -> (o, final_state)

    Args:
        q, k: [B, T, Hk, K] queries and keys
        v: [B, T, Hv, V] values; Hv a multiple of Hk (key head i serves value heads [i G, (i + 1) G),
            G = Hv // Hk)
        g: [B, T, Hv] log decay (<= 0: the state is scaled by exp(g) per token)
        beta: [B, T, Hv] write strength in (0, 1)
        scale: multiplies q; None: K ** -0.5
        initial_state: [N, Hv, K, V] the state each sequence starts from (N = B, or the n documents of
            cu_seqlens), or None (zeros); its gradient is part of the op's autograd
        output_final_state: also return the state each sequence ends with
        cu_seqlens: [n + 1] LongTensor of document boundaries 0 < ... < T of a packed batch (B = 1): each
            document runs from its own initial state, as if alone
        use_qk_l2norm_in_kernel: L2-normalise q and k first
        chunk_size: C, where the op takes it (gdn_cp's does; FLA's has its own)
    Returns:
        o [B, T, Hv, V] in v's dtype and on q's device; the final state [N, Hv, K, V] (in the accumulation
        dtype: fp32 for bf16 inputs) when output_final_state, else None.

    The recurrence: H_t = exp(g_t) (I - beta_t k_t k_t^T) H_{t-1} + beta_t k_t v_t^T, o_t = H_t^T (scale q_t).
    Autograd must cover q, k, v, g, beta and initial_state (the summary modes differentiate the state that
    enters a rank).
    """

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: float | None = None,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        use_qk_l2norm_in_kernel: bool = False,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class SummaryOp(Protocol):
    """A summary hook: the packed map [S | M] [N, Hv, K, V + K] of each sequence of a call of RuleOp's
    signature (N = B, or the n sequences of cu_seqlens), in the accumulation dtype: the state leaving it is
    M @ H + S for the state H entering it. Forward only (called without autograd; the summary modes take its
    gradient from calls of the op itself: gdn_cp.ops.affine.segment_summaries). It takes what its backend's
    op takes (chunk_size= where the op does, grouped value heads, cu_seqlens: the registry adapts the call as
    for `rule`)."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: float | None = None,
        cu_seqlens: torch.Tensor | None = None,
        use_qk_l2norm_in_kernel: bool = False,
        **kwargs: object,
    ) -> torch.Tensor: ...


class KCPRule(Protocol):
    """A backend's summaries-then-outputs pair (FLA's KCP, fla.ops.cp), gdn_cp.ops.summarise_chunks'
    signature: the packed [S | M] of some segments without outputs (`.summaries`), then the outputs at width V
    once the entering states are known (`.with_entering_states`), with one backward at width V after KCP's
    pre-pass. Built in for gdn_cp (its chunk stages) and fla (its kernels: gdn_cp.ops.backends.fla_kcp)."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        *,
        cu_seqlens: Sequence[int],
        carried: Sequence[bool],
        summarised: Sequence[int],
        maps: Sequence[bool] | None = None,
        fresh_state: torch.Tensor | None = None,
        recompute: bool = True,
        scale: float | None = None,
        use_qk_l2norm_in_kernel: bool = False,
        chunk_size: int = 64,
    ) -> Any: ...


def _never() -> bool:
    return False


def _no_problem() -> str | None:
    return None


def _runs_anywhere(device_type: str) -> str | None:
    return None


_LOADED: dict[str, RuleOp] = {}
_LOADED_SUMMARIES: dict[str, SummaryOp] = {}
_LOADED_KCP: dict[str, KCPRule] = {}
"""What each name's `op()`, `summary_op()` and `kcp_rule()` loaded, by name (the registry forgets a name's
when its entry changes: `forget_loaded`)."""


def forget_loaded(name: str) -> None:
    """Drop what was loaded under `name` (its next `op()` calls its entry's `load` again)."""
    for loaded in (_LOADED, _LOADED_SUMMARIES, _LOADED_KCP):
        loaded.pop(name, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """One registered op and what it supports; `rule` calls it."""

    name: str
    """The name configs, scenarios and results use."""
    description: str
    """One line: what it is."""
    load: Callable[[], RuleOp] = field(repr=False)
    """Returns the op, importing what it needs on first use (called once, on the first `op()`)."""
    devices: tuple[str, ...] | None = None
    """Device types it runs on ("cpu", "cuda", "npu"); None: any."""
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
    """Dtypes of q, k, v it computes in (fp64 only where listed)."""
    chunk_sizes: tuple[int, ...] | None = None
    """Chunk sizes it takes; None: any positive one."""
    takes_chunk_size: bool = True
    """The op takes chunk_size= (else it has its own, which must be listed in chunk_sizes)."""
    max_head_k_dim: int | None = None
    """The largest K its kernels hold (the state's rows); None: no limit."""
    grouped_values: bool = True
    """Takes Hv a multiple of Hk (each key head serving Hv / Hk value heads); else key heads are repeated."""
    varlen: bool = True
    """Takes cu_seqlens with one initial and final state per document; else called once per document."""
    takes_scale: bool = True
    """Takes scale=; else it applies K^-1/2 itself and another scale is refused."""
    packages: tuple[str, ...] = ()
    """Distributions whose versions describe it (for results' environment)."""
    device_problem: Callable[[str], str | None] = field(default=_runs_anywhere, repr=False)
    """Why it cannot run on a device type here beyond `devices` (FLA on a CPU without the interpreter), or
    None."""
    interpreted: Callable[[], bool] = field(default=_never, repr=False)
    """Whether its kernels would run in an interpreter here (FLA under TRITON_INTERPRET=1): correct in the
    dtypes of `interpreted_dtypes`, and far too slow for any timing to mean anything."""
    interpreted_dtypes: tuple[torch.dtype, ...] | None = None
    """The dtypes it computes correctly in where `interpreted()` (FLA: fp32 and fp16; Triton's interpreter
    returns garbage for its bf16 kernels); None: all of `dtypes`."""
    interpreter_problem: Callable[[], str | None] = field(default=_no_problem, repr=False)
    """Why its kernels cannot run in the interpreter here (a Triton without what
    gdn_cp.ops.backends.interpreter replaces), or None; asked only where `interpreted()`, by bench's
    preflight before any rank starts."""
    source: tuple[str, ...] = ()
    """Module prefixes its op comes from (`gdn_cp.ops.`, `fla.`): what ran is checked against them (`ran_as`),
    so that an op replaced behind the name (transformers rebinding its fallback to FLA's kernel) is caught;
    () checks nothing."""
    swapped_hint: str = ""
    """Why an op from elsewhere may stand behind the name, and what to do (ends `ran_as`'s message)."""
    modules: tuple[str, ...] = ()
    """Modules `load` imports (`fla.ops.gated_delta_rule`), for `unavailable`: found on the path, never
    imported, where the op does not run (a launcher: importing a kernel package may query the device)."""
    summary: Callable[[], SummaryOp] | None = field(default=None, repr=False)
    """Returns the summary hook (SummaryOp), loading it on first use like `load`; None: `summarise` falls
    back to the seam (one call of the op at width V + K)."""
    kcp: Callable[[], KCPRule] | None = field(default=None, repr=False)
    """Returns the summaries-then-outputs pair (KCPRule), loaded on first use; None: the summary modes take
    the summaries from `summarise` and the outputs from the op (gdn_cp.ops.affine)."""
    checked: str = "not checked at registration: bench doctor's kernels group checks it"
    """What register_backend's check found (gdn_cp.ops.backends.checks.registration_check): "checked on
    cpu float32: ...", or "not checked: <why>" (check=False, or no device of it here)."""

    def op(self) -> RuleOp:
        """The op, loaded on first use."""
        if self.name not in _LOADED:
            _LOADED[self.name] = self.load()
        return _LOADED[self.name]

    def ran_as(self, op: str) -> str | None:
        """None if `op` (the `module.qualname` the seam called, gdn_cp.ops.ran) is this backend's own; else
        one line naming what was asked and what ran."""
        if not self.source or op.startswith(self.source):
            return None
        hint = f": {self.swapped_hint}" if self.swapped_hint else ""
        return f"asked backend {self.name}, ran {op}{hint}"

    def unavailable(self) -> str | None:
        """Why its op could not load here, found without importing anything (each of `modules` looked up on
        the path, gdn_cp.ops.backends.findable), or None. `op()` is the full check, where the op runs."""
        for module in self.modules:
            if not module_findable(module):
                packages = f" (its packages: {', '.join(self.packages)})" if self.packages else ""
                return f"backend {self.name!r} needs module {module}, which is not installed here{packages}"
        return None

    def versions(self) -> dict[str, str]:
        """Installed version of each of `packages` ("absent" where it is not installed)."""
        out = {}
        for package in self.packages:
            try:
                out[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                out[package] = "absent"
        return out

    def check(
        self,
        *,
        device: torch.device | str | None,
        dtype: torch.dtype,
        chunk_size: int,
        head_k_dim: int,
        scale: float | None = None,
    ) -> None:
        """ValueError naming `backend` and the fix if this backend cannot run such a call (device None: the
        device is not checked)."""
        fix = f"choose backend={DEFAULT_BACKEND!r}, which runs everywhere, or"
        kind = None if device is None else torch.device(device).type
        if kind is not None and self.devices is not None and kind not in self.devices:
            raise ValueError(
                f"backend {self.name!r} does not run on {kind}: it runs on {', '.join(self.devices)}; {fix} "
                "a device it runs on"
            )
        problem = None if kind is None else self.device_problem(kind)
        if problem is not None:
            raise ValueError(problem)
        if dtype not in self.dtypes:
            raise ValueError(
                f"backend {self.name!r} does not compute in {_named(dtype)}: it takes "
                f"{', '.join(map(_named, self.dtypes))}; {fix} one of its dtypes"
            )
        if (
            self.interpreted_dtypes is not None
            and dtype not in self.interpreted_dtypes
            and self.interpreted()
        ):
            named = " or ".join(map(_named, self.interpreted_dtypes))
            raise ValueError(
                f"backend {self.name!r} returns garbage in {_named(dtype)} under Triton's interpreter "
                f"(TRITON_INTERPRET is on; rel error ~1e10): interpreted, it computes {named} only; {fix} "
                f"dtype {named} (or unset TRITON_INTERPRET on a GPU)"
            )
        if self.chunk_sizes is not None and chunk_size not in self.chunk_sizes:
            raise ValueError(
                f"backend {self.name!r} takes chunk_size in {list(self.chunk_sizes)}, got {chunk_size}: set "
                f"chunk_size to one of them, or {fix.removesuffix(', or')}"
            )
        if self.max_head_k_dim is not None and head_k_dim > self.max_head_k_dim:
            raise ValueError(
                f"backend {self.name!r} holds key head dims up to {self.max_head_k_dim}, got head_k_dim = "
                f"{head_k_dim}: {fix} a smaller head_k_dim"
            )
        if not self.takes_scale and scale is not None and scale != head_k_dim**-0.5:
            raise ValueError(
                f"backend {self.name!r} always scales q by K^-1/2 and takes no other scale, got {scale}: "
                f"pass scale=None, or {fix.removesuffix(', or')}"
            )

    def summarise(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        *,
        scale: float | None = None,
        cu_seqlens: torch.Tensor | Sequence[int] | None = None,
        use_qk_l2norm_in_kernel: bool = False,
        chunk_size: int = 64,
    ) -> torch.Tensor:
        """[N, Hv, K, V + K] the packed map [S | M] of each sequence (N = B, or the n sequences of cu_seqlens,
        B = 1), in the accumulation dtype, without outputs or graph: the summary hook, or the seam's call at
        width V + K from [0 | I] for a backend without one (its final state is [S | M]). What the hook
        returned is checked as `rule` checks the op's (gdn_cp.ops.backends.returned)."""
        with torch.no_grad():
            if self.summary is None:
                return self._seam_summary(
                    q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm_in_kernel, chunk_size
                )
            q, k, kw = self._adapted(q, k, v, scale, use_qk_l2norm_in_kernel, chunk_size)
            hook = self.summary_op()
            op_called(self.name, hook)

            def call(*inputs: torch.Tensor, sequences: int, **more: object) -> torch.Tensor:
                return checked_maps(
                    self.name, hook(*inputs, **kw, **more), q=inputs[0], v=inputs[2], n=sequences
                )

            if cu_seqlens is None:
                return call(q, k, v, g, beta, sequences=q.shape[0])
            check_packed_batch(q.shape[0])
            bounds = document_bounds(cu_seqlens, q.shape[1])
            if self.varlen:
                cu = torch.tensor(bounds, device=q.device)
                return call(q, k, v, g, beta, sequences=len(bounds) - 1, cu_seqlens=cu)
            return torch.cat(
                [call(*(x[:, lo:hi] for x in (q, k, v, g, beta)), sequences=1) for lo, hi in pairwise(bounds)]
            )

    def _adapted(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None,
        use_qk_l2norm_in_kernel: bool,
        chunk_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
        """A call checked against the entry (`check`) and adapted to what its op and hook take: (q, k with key
        heads repeated for an op without grouped values, the keyword arguments it takes)."""
        self.check(device=q.device, dtype=q.dtype, chunk_size=chunk_size, head_k_dim=q.shape[-1], scale=scale)
        group = v.shape[2] // q.shape[2]
        if not self.grouped_values and group > 1:
            q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
        kw: dict[str, object] = {"use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel}
        if self.takes_chunk_size:
            kw["chunk_size"] = chunk_size
        if self.takes_scale:
            kw["scale"] = scale
        return q, k, kw

    def summary_op(self) -> SummaryOp:
        """The summary hook, loaded on first use (ValueError where the backend has none)."""
        if self.summary is None:
            raise ValueError(
                f"backend {self.name!r} has no summary hook: Backend.summarise falls back to its op"
            )
        if self.name not in _LOADED_SUMMARIES:
            self.op()  # the op's loader prepares what the hook runs on (FLA: Triton's interpreter on a CPU)
            _LOADED_SUMMARIES[self.name] = self.summary()
        return _LOADED_SUMMARIES[self.name]

    def kcp_rule(self) -> KCPRule:
        """The summaries-then-outputs pair, loaded on first use (ValueError where the backend has none)."""
        if self.kcp is None:
            raise ValueError(f"backend {self.name!r} has no summaries-then-outputs pair (Backend.kcp)")
        if self.name not in _LOADED_KCP:
            self.op()  # the op's loader prepares what the pair runs on (FLA: Triton's interpreter on a CPU)
            _LOADED_KCP[self.name] = self.kcp()
        return _LOADED_KCP[self.name]

    def _seam_summary(self, q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm_in_kernel, chunk_size):
        """The fallback: the op at width V + K, v_ext = [v | 0], every sequence entering with [0 | I]."""
        B, _, Hv, V = v.shape
        K = q.shape[-1]
        n = B if cu_seqlens is None else len(document_bounds(cu_seqlens, q.shape[1])) - 1
        acc = accumulation_dtype(v.dtype)
        h0 = torch.zeros(n, Hv, K, V + K, dtype=acc, device=v.device)
        h0[..., V:] = torch.eye(K, dtype=acc, device=v.device)
        _, final = self.rule(
            q,
            k,
            torch.cat([v, v.new_zeros(*v.shape[:-1], K)], dim=-1),
            g,
            beta,
            scale=scale,
            initial_state=h0,
            output_final_state=True,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            chunk_size=chunk_size,
        )
        return final

    def rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        *,
        scale: float | None = None,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        cu_seqlens: torch.Tensor | Sequence[int] | None = None,
        use_qk_l2norm_in_kernel: bool = False,
        chunk_size: int = 64,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The chunked gated delta rule through this backend (arguments and results: RuleOp; chunk_size
        passed where the op takes it): the call checked against the entry, adapted, the op called, and what
        it returned checked (shapes, dtype, device: gdn_cp.ops.backends.returned), one ValueError naming the
        backend and the tensor otherwise."""
        q, k, kw = self._adapted(q, k, v, scale, use_qk_l2norm_in_kernel, chunk_size)
        op = self.op()
        op_called(self.name, op)

        def call(*inputs: torch.Tensor, state: torch.Tensor | None, sequences: int, **more: object):
            result = op(*inputs, initial_state=state, output_final_state=output_final_state, **kw, **more)
            o, final = checked_result(
                self.name, result, q=inputs[0], v=inputs[2], n=sequences, final=output_final_state
            )
            if state is not None and state.requires_grad and torch.is_grad_enabled():
                o = _StateInGraph.apply(o, state)
            return o, final

        if cu_seqlens is None:
            return call(q, k, v, g, beta, state=initial_state, sequences=q.shape[0])
        check_packed_batch(q.shape[0])
        bounds = document_bounds(cu_seqlens, q.shape[1])
        if self.varlen:
            cu = torch.tensor(bounds, dtype=torch.long, device=q.device)
            return call(q, k, v, g, beta, state=initial_state, sequences=len(bounds) - 1, cu_seqlens=cu)
        # One call per document (B = 1): the op sees each as a sequence of its own.
        outs, finals = [], []
        for i, (lo, hi) in enumerate(pairwise(bounds)):
            o, final = call(
                *(x[:, lo:hi] for x in (q, k, v, g, beta)),
                state=None if initial_state is None else initial_state[i : i + 1],
                sequences=1,
            )
            outs.append(o)
            finals.append(final)
        return torch.cat(outs, dim=1), (torch.cat(finals) if output_final_state else None)


class _StateInGraph(torch.autograd.Function):
    """o unchanged; backward gives the initial state at least a zero gradient. An op that drops or detaches
    its initial_state would leave it none, and under CP the entering state's gradient is a collective every
    rank runs: the rank that sent the state would wait in it forever. So such an op is wrong (what
    register_backend's check refuses), never a hang."""

    @staticmethod
    def forward(ctx, o: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        ctx.state = (state.shape, state.dtype, state.device)
        return o.view_as(o)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape, dtype, device = ctx.state
        return grad, torch.zeros(shape, dtype=dtype, device=device)


def _named(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
