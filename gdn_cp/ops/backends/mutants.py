"""Built-in mutations of a backend's op, to prove that a check of it can fail (`bench doctor`'s kernels group,
register_backend's check, `bench verify`'s power). Each wraps the op so that it is wrong in one way an op
can be wrong under CP and nowhere else: the state entering a rank reaches the op as its initial_state, and the
summary modes read its final state as the rank's [S | M].

    op_state_ignored     the op runs every sequence from zeros (initial_state dropped)
    op_state_detached    initial_state used, its gradient cut (detached)
    op_state_scaled      initial_state x STATE_SCALE (0.99)
    op_final_transposed  the final state in [V, K] order in the declared [K, V] shape (a kernel that writes
                         its state column-major; for K = V, the transpose)

A mutant stands in for the backend as a user's op would (`stand_in`): the entry with its op wrapped, without
the summary hook or the summaries-then-outputs pair (they are not the op), so that the summary modes reach
it through the seam (gdn_cp.ops.affine). Only `mutated()` (the registry's entry swapped inside the block,
in this process) or an explicit `wrap` / `stand_in` turns one on: nothing in a config, a scenario or the CLI
reaches them. CP's own mutants (what moves between ranks) are gdn_cp.distributed.mutants.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from gdn_cp.ops.backends.entry import _LOADED, _LOADED_KCP, _LOADED_SUMMARIES, Backend, RuleOp
from gdn_cp.ops.backends.registry import add_backend, get_backend

STATE_SCALE = 0.99
"""op_state_scaled multiplies initial_state by this: a 1% error in the state a rank receives."""


@dataclass(frozen=True, slots=True)
class BackendMutant:
    """One named way a backend's op can be wrong under CP."""

    name: str
    description: str
    """What it breaks, as a report says it: "op ignores initial_state"."""
    needs_state_gradient: bool = False
    """It shows only where the op's initial_state carries a gradient back (the entering state of a
    summary mode's "recompute" path), not where the op gets a constant [0 | I] ("affine")."""

    def applies(self, mode: Any, checkpoint: bool) -> bool:
        """Whether it shows in a case of `mode` (a CPMode class) whose summary is checkpointed or not, on a
        backend reached through its op (`stand_in`): only the modes with a summary pass a state to the op
        (ulysses runs whole sequences from zeros), and checkpoint on is the path whose calls take the
        entering state with its graph (SequenceShardMode.local_path: "recompute"; off: "affine")."""
        return bool(mode.has_summary) and (checkpoint or not self.needs_state_gradient)


MUTANTS: tuple[BackendMutant, ...] = (
    BackendMutant("op_state_ignored", "op ignores initial_state"),
    BackendMutant("op_state_detached", "op detaches initial_state", needs_state_gradient=True),
    BackendMutant("op_state_scaled", f"op scales initial_state x {STATE_SCALE:g}"),
    BackendMutant("op_final_transposed", "op returns the final state transposed"),
)
"""Every backend mutant, in report order."""
BY_NAME: dict[str, BackendMutant] = {m.name: m for m in MUTANTS}


def wrap(op: RuleOp, name: str) -> RuleOp:
    """`op` (RuleOp's signature) broken as mutant `name` says; ValueError for an unknown name."""
    if name not in BY_NAME:
        raise ValueError(f"unknown backend mutant {name!r}; use one of {', '.join(BY_NAME)}")

    def mutant(q, k, v, g, beta, *args: Any, initial_state: torch.Tensor | None = None, **kw: Any):
        if initial_state is not None and name == "op_state_ignored":
            initial_state = None
        elif initial_state is not None and name == "op_state_detached":
            initial_state = initial_state.detach()
        elif initial_state is not None and name == "op_state_scaled":
            initial_state = initial_state * STATE_SCALE
        o, final = op(q, k, v, g, beta, *args, initial_state=initial_state, **kw)
        if final is not None and name == "op_final_transposed":
            final = final.transpose(-1, -2).contiguous().view(final.shape)
        return o, final

    mutant.__qualname__ = f"{name}({getattr(op, '__qualname__', type(op).__name__)})"
    return mutant


def stand_in(backend: Backend, name: str) -> Backend:
    """`backend`'s entry with its op (loaded now) broken as mutant `name` says, under the same name, without
    its summary hook or summaries-then-outputs pair, checked against no source (module docstring)."""
    op = wrap(backend.op(), name)
    return dataclasses.replace(
        backend,
        description=f"{backend.description}, mutated: {BY_NAME[name].description}",
        load=lambda: op,
        summary=None,
        kcp=None,
        source=(),
        checked=f"mutant {name} of backend {backend.name}",
    )


def applicable(mode: Any, options: Any, backend: Backend) -> list[BackendMutant]:
    """The mutants a case of `mode` (a CPMode class) under `options` (CPOptions) on `backend` can show, in
    order (BackendMutant.applies, with the checkpoint the mode applies to the backend's stand-in:
    CPMode.checkpoint_for, for an entry without a pair)."""
    checkpoint = mode.checkpoint_for(options, dataclasses.replace(backend, summary=None, kcp=None))
    return [m for m in MUTANTS if m.applies(mode, checkpoint)]


@contextmanager
def mutated(backend: str, name: str) -> Iterator[Backend]:
    """Inside the block, the registry's `backend` is its `stand_in` for mutant `name` (in this process: every
    rank of a group enters it); the entry and what it had loaded are restored after. ValueError for an
    unknown backend or mutant."""
    original = get_backend(backend)
    loaded = [(cache, cache.get(backend)) for cache in (_LOADED, _LOADED_SUMMARIES, _LOADED_KCP)]
    entry = add_backend(stand_in(original, name))
    try:
        yield entry
    finally:
        add_backend(original)
        for cache, op in loaded:
            if op is not None:
                cache[backend] = op
