"""The backend registry: which op computes the chunked gated delta rule on one device, and what it supports.

A backend is any op with flash-linear-attention's signature,

    op(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
       use_qk_l2norm_in_kernel=False[, chunk_size=C]) -> (o [B, T, Hv, V], final_state [N, Hv, K, V] | None)

whose autograd covers q, k, v, g, beta and initial_state. `Backend.rule` checks a call against what the
entry declares (one ValueError naming the option and the fix), adapts it (key heads repeated for an op
without grouped values, one call per sequence for an op without cu_seqlens) and calls the op, loaded on first
use. Every CP mode reaches the local op through it (gdn_cp.ops.affine for the summary modes).

A backend may also bring a summary hook (`Backend.summary`, SummaryOp): the packed map [S | M] of each
sequence without its outputs, what the summary modes exchange. `Backend.summarise` calls it, or, for an op
without one, falls back to the seam: one call of the op at value width V + K from [0 | I], its outputs
dropped (gdn_cp.ops.affine).
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
from gdn_cp.ops.backends.fla import (
    FLA_CHUNK_SIZES,
    FLA_MAX_HEAD_K_DIM,
    fla_device_problem,
    load_fla,
    triton_interpreted,
)
from gdn_cp.ops.backends.fla_kcp import load_fla_kcp
from gdn_cp.ops.backends.fla_summary import load_fla_summary
from gdn_cp.ops.backends.torch_fallback import TRANSFORMERS_SWAP_HINT, load_torch_fallback
from gdn_cp.ops.chunk import chunk_gated_delta_rule, chunk_state_maps, summarise_chunks
from gdn_cp.ops.documents import check_packed_batch, document_bounds
from gdn_cp.ops.ran import op_called, qualified_name
from gdn_cp.ops.recurrent import recurrent_gated_delta_rule

DEFAULT_BACKEND = "gdn_cp"
"""The backend every op, layer and CP mode uses unless told otherwise: this package's chunked op."""


class RuleOp(Protocol):
    """FLA's chunk_gated_delta_rule signature (shapes: gdn_cp.ops)."""

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
    """A summary hook: the packed map [S | M] [N, Hv, K, V + K] of each sequence of a call of FLA's signature
    (N = B, or the n sequences of cu_seqlens), in the accumulation dtype: the state leaving it is M @ H + S
    for the state H entering it. Forward only (called without autograd; the summary modes take its gradient
    from calls of the op itself: gdn_cp.ops.affine.segment_summaries). It takes what its backend's op takes
    (chunk_size= where the op does, grouped value heads, cu_seqlens: the registry adapts the call as for
    `rule`)."""

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


def _runs_anywhere(device_type: str) -> str | None:
    return None


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
    """Whether its kernels would run in an interpreter here (FLA under TRITON_INTERPRET=1): correct, and far
    too slow for any timing to mean anything."""
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
            named = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            raise ValueError(
                f"backend {self.name!r} does not compute in {str(dtype).removeprefix('torch.')}: it takes "
                f"{named}; {fix} one of its dtypes"
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
        width V + K from [0 | I] for a backend without one (its final state is [S | M])."""
        with torch.no_grad():
            if self.summary is None:
                return self._seam_summary(
                    q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm_in_kernel, chunk_size
                )
            self.check(
                device=q.device, dtype=q.dtype, chunk_size=chunk_size, head_k_dim=q.shape[-1], scale=scale
            )
            hook = self.summary_op()
            op_called(self.name, hook)
            group = v.shape[2] // q.shape[2]
            if not self.grouped_values and group > 1:
                q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
            kw: dict[str, object] = {"use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel}
            if self.takes_chunk_size:
                kw["chunk_size"] = chunk_size
            if self.takes_scale:
                kw["scale"] = scale
            if cu_seqlens is None:
                return hook(q, k, v, g, beta, **kw)
            check_packed_batch(q.shape[0])
            bounds = document_bounds(cu_seqlens, q.shape[1])
            if self.varlen:
                return hook(q, k, v, g, beta, cu_seqlens=torch.tensor(bounds, device=q.device), **kw)
            return torch.cat(
                [hook(*(x[:, lo:hi] for x in (q, k, v, g, beta)), **kw) for lo, hi in pairwise(bounds)]
            )

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
        """The chunked gated delta rule through this backend, with gdn_cp.ops.chunk_gated_delta_rule's
        arguments and results (shapes: gdn_cp.ops): checked, adapted, called."""
        self.check(device=q.device, dtype=q.dtype, chunk_size=chunk_size, head_k_dim=q.shape[-1], scale=scale)
        group = v.shape[2] // q.shape[2]
        if not self.grouped_values and group > 1:
            q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
        kw: dict[str, object] = {"use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel}
        if self.takes_chunk_size:
            kw["chunk_size"] = chunk_size
        if self.takes_scale:
            kw["scale"] = scale
        op = self.op()
        op_called(self.name, op)
        if cu_seqlens is None:
            return op(
                q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state, **kw
            )
        check_packed_batch(q.shape[0])
        bounds = document_bounds(cu_seqlens, q.shape[1])
        if self.varlen:
            cu = torch.tensor(bounds, dtype=torch.long, device=q.device)
            return op(
                q,
                k,
                v,
                g,
                beta,
                initial_state=initial_state,
                output_final_state=output_final_state,
                cu_seqlens=cu,
                **kw,
            )
        # One call per document (B = 1): the op sees each as a sequence of its own.
        outs, finals = [], []
        for i, (lo, hi) in enumerate(pairwise(bounds)):
            o, final = op(
                *(x[:, lo:hi] for x in (q, k, v, g, beta)),
                initial_state=None if initial_state is None else initial_state[i : i + 1],
                output_final_state=output_final_state,
                **kw,
            )
            outs.append(o)
            finals.append(final)
        return torch.cat(outs, dim=1), (torch.cat(finals) if output_final_state else None)


_REGISTRY: dict[str, Backend] = {}
_LOADED: dict[str, RuleOp] = {}
_LOADED_SUMMARIES: dict[str, SummaryOp] = {}
_LOADED_KCP: dict[str, KCPRule] = {}


def add_backend(backend: Backend) -> Backend:
    """Register `backend` under its name (replacing an entry of the same name, whose loaded op is dropped)."""
    if not isinstance(backend.name, str) or not backend.name.isidentifier():
        raise ValueError(f"a backend's name must be an identifier (letters, digits, _), got {backend.name!r}")
    _REGISTRY[backend.name] = backend
    _LOADED.pop(backend.name, None)
    _LOADED_SUMMARIES.pop(backend.name, None)
    _LOADED_KCP.pop(backend.name, None)
    return backend


def register_backend(
    name: str,
    op: RuleOp,
    *,
    description: str = "a user-registered op of FLA's signature",
    devices: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16, torch.float16),
    chunk_sizes: Sequence[int] | None = None,
    takes_chunk_size: bool = False,
    max_head_k_dim: int | None = None,
    grouped_values: bool = False,
    varlen: bool = False,
    takes_scale: bool = True,
    packages: Sequence[str] = (),
    summary: SummaryOp | None = None,
) -> Backend:
    """Register a user's op (an NPU kernel, a vendor build) under `name`, for every op, layer and CP mode
    (backend=`name`). The defaults assume the least of it: no chunk_size argument (its own chunking), no
    grouped value heads (key heads are repeated for it) and no cu_seqlens (called once per document); say
    more where the op does more. `summary`: its summary hook (SummaryOp), taking what the op takes; without
    one the summary modes compute [S | M] with the op at width V + K. Returns the entry."""
    return add_backend(
        Backend(
            name=name,
            description=description,
            load=lambda: op,
            devices=None if devices is None else tuple(devices),
            dtypes=tuple(dtypes),
            chunk_sizes=None if chunk_sizes is None else tuple(chunk_sizes),
            takes_chunk_size=takes_chunk_size,
            max_head_k_dim=max_head_k_dim,
            grouped_values=grouped_values,
            varlen=varlen,
            takes_scale=takes_scale,
            packages=tuple(packages),
            source=_source_of(op) + (() if summary is None else _source_of(summary)),
            summary=None if summary is None else (lambda: summary),
        )
    )


def _source_of(op: RuleOp) -> tuple[str, ...]:
    """What a registered op's calls must come from: the module that defines it (a partial's function's)."""
    module = qualified_name(op).rsplit(".", 1)[0]
    return () if module == "?" else (module,)


def unregister_backend(name: str) -> None:
    """Remove a user's entry (the built-in ones stay)."""
    if name in {b.name for b in BUILT_IN}:
        raise ValueError(f"backend {name!r} is built in and cannot be removed")
    _REGISTRY.pop(name, None)
    _LOADED.pop(name, None)
    _LOADED_SUMMARIES.pop(name, None)
    _LOADED_KCP.pop(name, None)


def backend_names() -> tuple[str, ...]:
    """Registered names, the built-in ones first."""
    return tuple(_REGISTRY)


def get_backend(name: str) -> Backend:
    """The entry of `name`; ValueError listing the registered ones otherwise."""
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown backend {name!r}; use one of {', '.join(_REGISTRY)}, or register your op first with "
            "gdn_cp.ops.register_backend(name, op, ...)"
        )
    return _REGISTRY[name]


def _load_gdn_cp() -> RuleOp:
    return chunk_gated_delta_rule


def _load_recurrent() -> RuleOp:
    return recurrent_gated_delta_rule


def _load_gdn_cp_summary() -> SummaryOp:
    return chunk_state_maps


def _load_gdn_cp_kcp() -> KCPRule:
    return summarise_chunks


BUILT_IN: tuple[Backend, ...] = (
    Backend(
        name=DEFAULT_BACKEND,
        description="this package's chunked op (eager torch, any device, fp64 too)",
        load=_load_gdn_cp,
        dtypes=(torch.float64, torch.float32, torch.bfloat16, torch.float16),
        source=("gdn_cp.ops.",),
        summary=_load_gdn_cp_summary,
        kcp=_load_gdn_cp_kcp,
    ),
    Backend(
        name="fla",
        description="flash-linear-attention's Triton kernels (fla-core), imported on first use",
        load=load_fla,
        devices=("cuda", "npu", "cpu"),
        chunk_sizes=FLA_CHUNK_SIZES,
        max_head_k_dim=FLA_MAX_HEAD_K_DIM,
        packages=("fla-core", "flash-linear-attention", "triton"),
        device_problem=fla_device_problem,
        interpreted=triton_interpreted,
        modules=("fla.ops.gated_delta_rule", "triton"),
        source=("fla.", "gdn_cp.ops.backends.fla_"),  # its op, and the hook and pair built on its kernels
        summary=load_fla_summary,
        kcp=load_fla_kcp,
    ),
    Backend(
        name="transformers",
        description="transformers' torch fallback (torch_chunk_gated_delta_rule): a peer reference",
        load=load_torch_fallback,
        grouped_values=False,
        varlen=False,
        takes_scale=False,
        packages=("transformers",),
        modules=("transformers.models.qwen3_5.modeling_qwen3_5",),
        source=("transformers.",),
        swapped_hint=TRANSFORMERS_SWAP_HINT,
    ),
    Backend(
        name="recurrent",
        description="the token-by-token reference (gdn_cp.ops.recurrent_gated_delta_rule): exact and slow, "
        "for checks (bench's correctness gate compares every case with it)",
        load=_load_recurrent,
        dtypes=(torch.float64, torch.float32, torch.bfloat16, torch.float16),
        takes_chunk_size=False,
        source=("gdn_cp.ops.",),
    ),
)
"""The entries every process starts with."""
for _backend in BUILT_IN:
    add_backend(_backend)
