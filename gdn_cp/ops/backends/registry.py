"""The backend registry: the entries by name. It holds them (the built-in ones, each declared by its own
module, and a user's), checks them (a name, and for `register_backend` the op itself:
gdn_cp.ops.backends.checks) and looks them up. What an entry is and how its op is called: entry.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from gdn_cp.ops.backends.checks import registration_check
from gdn_cp.ops.backends.entry import (  # noqa: F401 (the loaded ops by name: a test site swaps them here)
    _LOADED,
    _LOADED_KCP,
    _LOADED_SUMMARIES,
    DEFAULT_BACKEND,
    Backend,
    RuleOp,
    SummaryOp,
    forget_loaded,
)
from gdn_cp.ops.backends.fla import FLA
from gdn_cp.ops.backends.native import GDN_CP, RECURRENT
from gdn_cp.ops.backends.plugins import load_backend_plugins
from gdn_cp.ops.backends.torch_fallback import TRANSFORMERS
from gdn_cp.ops.ran import qualified_name

BUILT_IN: tuple[Backend, ...] = (GDN_CP, FLA, TRANSFORMERS, RECURRENT)
"""The entries every process starts with, in this order (each declared by its module)."""

_REGISTRY: dict[str, Backend] = {}
_UNCHECKED_NAMES: ContextVar[bool] = ContextVar("gdn_cp_unchecked_backend_names", default=False)


def add_backend(backend: Backend) -> Backend:
    """Register `backend` under its name (replacing an entry of the same name, whose loaded op is dropped)."""
    if not isinstance(backend.name, str) or not backend.name.isidentifier():
        raise ValueError(f"a backend's name must be an identifier (letters, digits, _), got {backend.name!r}")
    _REGISTRY[backend.name] = backend
    forget_loaded(backend.name)
    return backend


def register_backend(
    name: str,
    op: RuleOp,
    *,
    description: str = "a user-registered op of RuleOp's signature (FLA's)",
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
    check: bool = True,
) -> Backend:
    """Register a user's op (an NPU kernel, a vendor build) under `name`, for every op, layer and CP mode
    (backend=`name`). The defaults assume the least of it: no chunk_size argument (its own chunking), no
    grouped value heads (key heads are repeated for it) and no cu_seqlens (called once per document); say
    more where the op does more. `summary`: its summary hook (SummaryOp), taking what the op takes; without
    one the summary modes compute [S | M] with the op at width V + K.

    `check` (default): the op is checked first, in milliseconds (gdn_cp.ops.backends.checks: against the
    recurrent reference in fp64, on the CPU in fp32 where it runs there, else on the first of its devices
    this process already uses: a registration creates no device context), and refused with one ValueError
    naming what it got wrong (it ignores, detaches or scales initial_state, returns its final state
    transposed, or is off the reference); where it cannot run here it is registered "not checked: <why>".
    check=False skips it, recorded as such. What was found is the entry's `checked`. Returns the entry."""
    entry = Backend(
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
        checked="not checked: registered with check=False",
    )
    if not isinstance(name, str) or not name.isidentifier():
        add_backend(entry)  # the name's own error
    if check:
        forget_loaded(name)  # the check loads the new op under its name: not one registered before it
        try:
            entry = dataclasses.replace(entry, checked=registration_check(entry))
        finally:
            forget_loaded(name)
    return add_backend(entry)


def _source_of(op: RuleOp) -> tuple[str, ...]:
    """What a registered op's calls must come from: the module that defines it (a partial's function's)."""
    module = qualified_name(op).rsplit(".", 1)[0]
    return () if module == "?" else (module,)


def unregister_backend(name: str) -> None:
    """Remove a user's entry (the built-in ones stay)."""
    if name in {b.name for b in BUILT_IN}:
        raise ValueError(f"backend {name!r} is built in and cannot be removed")
    _REGISTRY.pop(name, None)
    forget_loaded(name)


def backend_names() -> tuple[str, ...]:
    """Registered names, the built-in ones first."""
    return tuple(_REGISTRY)


def unknown_backend(name: object) -> str:
    """The one line for a backend name nothing registered: the registered ones, and how to register."""
    return (
        f"unknown backend {name!r}; use one of {', '.join(_REGISTRY)}, or register your op first with "
        "gdn_cp.ops.register_backend(name, op, ...)"
    )


def get_backend(name: str) -> Backend:
    """The entry of `name`; ValueError listing the registered ones otherwise. A name nobody registered loads
    the installed plugins first (gdn_cp.ops.backends.plugins: once per process)."""
    if name not in _REGISTRY:
        load_backend_plugins()
    if name not in _REGISTRY:
        raise ValueError(unknown_backend(name))
    return _REGISTRY[name]


def is_known(name: str) -> bool:
    """Whether `name` is registered (the installed plugins loaded first, as `get_backend` does), or names
    are not checked here (`names_unchecked`)."""
    if name not in _REGISTRY and not _UNCHECKED_NAMES.get():
        load_backend_plugins()
    return name in _REGISTRY or _UNCHECKED_NAMES.get()


@contextmanager
def names_unchecked() -> Iterator[None]:
    """Inside the block, a name nothing registered is known (`is_known`): for reading stored records
    (a result file of a backend registered in the process that ran it), where the name is data; running
    it still needs the backend (`get_backend`)."""
    token = _UNCHECKED_NAMES.set(True)
    try:
        yield
    finally:
        _UNCHECKED_NAMES.reset(token)


for _backend in BUILT_IN:
    add_backend(_backend)
