"""What ran: the program a call actually executed, recorded where it is decided, while a `recording()` block
is open (a no-op otherwise).

What was asked and what ran can differ: transformers rebinds its torch fallback to FLA's kernel whenever
`fla` imports; a compare's older ref may not know an option its case sets; a registered op may be replaced.
So the code records itself at the points that decide: the backend seam (gdn_cp.ops.backends.Backend.rule)
notes the callable it calls, a CP mode notes its class, its options as applied and the local path it takes
(gdn_cp.distributed.modes), a layer on one device notes that no mode ran. bench's ranks record their first
pass and check it against the case before anything is timed (bench.measure.gate).

    with recording() as rec:
        layer(x).backward(grad)
    rec.calls   # [Ran(mode="p2p", local_path="kcp", ops=[OpRan(backend="gdn_cp", op="gdn_cp.ops...")])]
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class OpRan:
    """One local op the backend seam called."""

    backend: str
    """The registry name it was called under (gdn_cp.ops.backends)."""
    op: str
    """The callable actually called, `module.qualname`
    (e.g. fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule)."""


@dataclass(kw_only=True, slots=True)
class Ran:
    """What one call of a layer (or of the CP op, gdn_cp.distributed.cp_chunk_gated_delta_rule) ran."""

    call: str
    """What was called: the layer's class (GatedDeltaNet, ...) or "op"."""
    mode: str | None = None
    """The CP mode that ran it; None: one device, no CP."""
    mode_class: str | None = None
    """Its class, `module.qualname`."""
    layout: str | None = None
    """The options as the mode applied them (gdn_cp.distributed.CPOptions); None on one device."""
    checkpoint_summary: bool | None = None
    overlap: bool | None = None
    local_path: str | None = None
    """How the rank computed its local op (CPMode.local_path: whole, kcp, kcp-kept, split, recompute or
    affine); None on one device."""
    chunk_size: int | None = None
    dtype: str | None = None
    """The dtype of q, k, v as the op got them (fp32, bf16, ...)."""
    precision: str | None = None
    """How fp32 matmuls ran on the device at the call (gdn_cp.dtypes.current_precision)."""
    ops: list[OpRan] = field(default_factory=list)
    """The distinct ops the seam called during the call's forward, in the order first called."""


@dataclass(kw_only=True, slots=True)
class Recording:
    """Everything recorded while one `recording()` block was open."""

    calls: list[Ran] = field(default_factory=list)
    """Each layer or op call, in order."""
    other_ops: list[OpRan] = field(default_factory=list)
    """Ops called outside any call's forward (a backward's recomputation), distinct, in order."""
    open: list[Ran] = field(default_factory=list, repr=False)

    def all_ops(self) -> list[OpRan]:
        """Every distinct op called while recording, in the order first called."""
        seen: list[OpRan] = []
        for op in [o for c in self.calls for o in c.ops] + self.other_ops:
            if op not in seen:
                seen.append(op)
        return seen


_RECORDINGS: list[Recording] = []
"""The open recordings, innermost last (usually none, or one)."""


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Record what every call in the block runs (module docstring)."""
    found = Recording()
    _RECORDINGS.append(found)
    try:
        yield found
    finally:
        _RECORDINGS.remove(found)


@contextlib.contextmanager
def call_scope(call: str, **fields: object) -> Iterator[None]:
    """A layer or op call: what runs inside the block is recorded as one `Ran` (fields as given; `note` adds
    more). Calls inside an open call are folded into it."""
    if not _RECORDINGS or _RECORDINGS[-1].open:
        yield
        return
    current = _RECORDINGS[-1]
    ran = Ran(call=call, **fields)  # type: ignore[arg-type]
    current.calls.append(ran)
    current.open.append(ran)
    try:
        yield
    finally:
        current.open.remove(ran)


def note(**fields: object) -> None:
    """Set fields of the innermost open call (a mode's local path, once it is chosen)."""
    if _RECORDINGS and _RECORDINGS[-1].open:
        ran = _RECORDINGS[-1].open[-1]
        for name, value in fields.items():
            setattr(ran, name, value)


def op_called(backend: str, op: Callable) -> None:
    """The seam called `op` under the name `backend`."""
    if not _RECORDINGS:
        return
    current = _RECORDINGS[-1]
    found = OpRan(backend=backend, op=qualified_name(op))
    ops = current.open[-1].ops if current.open else current.other_ops
    if found not in ops:
        ops.append(found)


def qualified_name(obj: object) -> str:
    """`module.qualname` of a function, class or callable object (a partial: of the function it wraps)."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    target = obj if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj) else type(obj)
    module = getattr(target, "__module__", None) or "?"
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{module}.{name}"
