"""Built-in mutations of CP, to prove that an accuracy check can fail (`bench verify`'s power).

Each mutant is one way CP could move data wrongly between ranks, applied on chosen ranks (default rank 1,
where a state first enters) by a hook at the exact point where CP moves that data:

    state_dropped       the state entering each of the rank's pieces is zero    where the modes'
    state_scaled        ... is scaled by STATE_SCALE (0.99)                     `begin_entering_states`
    state_grad_dropped  the entering state's gradient is not sent back (zeros)  return (transfers, modes)
    halo_dropped        the Conv1D halo of the rank's pieces is empty           collectives.exchange_halos
    boundary_moved      a document boundary of the rank's view moved by 1 token header.plan_documents
    summary_twice       the rank's own summary in place of the one before it   the gather's fold, the
                        (a gathered slot duplicated, a message sent twice)      scan's first round
    heads_permuted      the inverse all-to-all's heads in reversed rank order   the heads' return to shards

Only `mutated()` turns one on, in this process: nothing in a config, a scenario or the CLI reaches it
(bench.verification's rank functions and the tests call it). With none on, every hook is one check of the
module-level `ACTIVE` against None.

Which mutants a case can show is `Mutant.applies` (a mode's facts, not its name: the state and the halo
move in the modes with a summary, the summaries of other ranks in those that hold them, heads in the one
without; a moved boundary needs documents).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from gdn_cp.distributed.layout import ShardPlan

STATE_SCALE = 0.99
"""state_scaled multiplies the entering state by this: a 1% error in what crosses ranks."""
DEFAULT_RANKS: tuple[int, ...] = (1,)
"""The ranks a mutant runs on by default: rank 1 is the first whose pieces receive a state (rank 0's first
piece starts the sequence), and a bug on one rank is the hardest for a check to see."""


@dataclass(frozen=True, slots=True)
class Mutant:
    """One named mutation of CP's data movement."""

    name: str
    description: str
    """What it breaks, as a report says it: "incoming state dropped"."""
    summary_modes: bool | None = None
    """True: the modes with a summary (the state, its gradient and the halo cross ranks there); False: the
    mode without one (heads cross ranks); None: every mode."""
    holds_summaries: bool = False
    """Only modes that hold other ranks' summaries (CPMode.held_summaries > 0)."""
    needs_documents: bool = False
    """Only with packed documents (a boundary to move)."""

    def applies(self, mode: Any, documents: bool) -> bool:
        """Whether `mode` (a CPMode class) on a case with (`documents`) or without packed documents moves
        the data this mutant breaks."""
        if self.summary_modes is not None and bool(mode.has_summary) != self.summary_modes:
            return False
        if self.holds_summaries and mode.held_summaries(2) == 0:
            return False
        return documents or not self.needs_documents


MUTANTS: tuple[Mutant, ...] = (
    Mutant("state_dropped", "incoming state dropped", summary_modes=True),
    Mutant("state_scaled", f"incoming state x {STATE_SCALE:g}", summary_modes=True),
    Mutant("state_grad_dropped", "state gradient not sent back", summary_modes=True),
    Mutant("halo_dropped", "conv halo dropped", summary_modes=True),
    Mutant("boundary_moved", "document boundary moved by one token", needs_documents=True),
    Mutant("summary_twice", "a summary slot duplicated", summary_modes=True, holds_summaries=True),
    Mutant("heads_permuted", "inverse all-to-all permuted", summary_modes=False),
)
"""Every mutant, in report order."""
BY_NAME: dict[str, Mutant] = {m.name: m for m in MUTANTS}


def applicable(mode: Any, documents: bool) -> list[Mutant]:
    """The mutants a case of `mode` (a CPMode class), with or without documents, can show, in order."""
    return [m for m in MUTANTS if m.applies(mode, documents)]


@dataclass(frozen=True, slots=True)
class Active:
    """The mutant on in this process, and the group ranks it runs on."""

    name: str
    ranks: frozenset[int]


ACTIVE: Active | None = None
"""The mutant on, or None (always, outside `mutated`): what every hook checks first."""


@contextmanager
def mutated(name: str, ranks: Iterable[int] = DEFAULT_RANKS) -> Iterator[Mutant]:
    """Turn mutant `name` on for the group ranks `ranks` inside the block (every rank of the group enters
    it; the others run unbroken). ValueError for an unknown name; mutants do not nest."""
    global ACTIVE
    if name not in BY_NAME:
        raise ValueError(f"unknown mutant {name!r}; use one of {', '.join(BY_NAME)}")
    if ACTIVE is not None:
        raise ValueError(f"mutant {ACTIVE.name!r} is already on; mutants do not nest")
    ACTIVE = Active(name, frozenset(ranks))
    try:
        yield BY_NAME[name]
    finally:
        ACTIVE = None


def _on(name: str, rank: int) -> bool:
    return ACTIVE is not None and ACTIVE.name == name and rank in ACTIVE.ranks


# -- the mutations, each called by its hook when ACTIVE is not None ------------------------------------------


class _GradientNotReturned(torch.autograd.Function):
    """The identity forward; backward returns zeros: what a rank sends back for the state is lost."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad)


def entering_states(h_in: torch.Tensor, rank: int) -> torch.Tensor:
    """H_in [P, B, Hv, K, V] of this rank's pieces, as a state mutant leaves it (kept in the graph, so
    that the exchange's backward still runs on every rank)."""
    if _on("state_dropped", rank):
        return h_in * 0.0
    if _on("state_scaled", rank):
        return h_in * STATE_SCALE
    if _on("state_grad_dropped", rank):
        return _GradientNotReturned.apply(h_in)
    return h_in


def halos(received: list[torch.Tensor], rank: int) -> list[torch.Tensor]:
    """Each piece's halo [B, <= w, D]; halo_dropped leaves them empty (views, so the exchange's backward
    still runs here), as at the sequence start: causal_conv1d then zero-fills the window."""
    if _on("halo_dropped", rank):
        return [h[:, :0] for h in received]
    return received


def document_bounds(bounds: list[int] | None, plan: ShardPlan) -> list[int] | None:
    """This rank's view of the global boundaries [0, ..., T]; boundary_moved moves the first interior
    boundary inside one of its pieces one token later (earlier where that would meet the next boundary).
    Unchanged when no boundary falls inside the rank's pieces."""
    if bounds is None or not _on("boundary_moved", plan.rank):
        return bounds
    pieces = [(plan.starts[j], plan.starts[j] + plan.lengths[j]) for j in plan.local_pieces]
    for i in range(1, len(bounds) - 1):
        if any(start < bounds[i] < end for start, end in pieces):
            moved = list(bounds)
            moved[i] += 1 if bounds[i] + 1 < bounds[i + 1] else -1
            if moved[i] > moved[i - 1]:
                return moved
    return bounds


def ordered_summaries(ordered: torch.Tensor, first_piece: int, rank: int) -> torch.Tensor:
    """Every piece's packed summary [N, B, Hv, K, V + K] in global order, as this rank folds them;
    summary_twice puts the summary of the rank's first piece in the slot before it as well (a slot
    duplicated: the fold before that piece then ends with the piece's own map)."""
    if first_piece < 1 or not _on("summary_twice", rank):
        return ordered
    source = torch.arange(ordered.shape[0], device=ordered.device)
    source[first_piece - 1] = first_piece
    return ordered.index_select(0, source)


def received_summaries(received: torch.Tensor, own: torch.Tensor, rank: int) -> torch.Tensor:
    """The packed summaries [P, B, Hv, K, V + K] a rank receives in scan's first round (I_{v-1} = x_{v-1});
    summary_twice delivers each piece's own summary `own` instead (its summary sent twice, once in place of
    its predecessor's), kept on `received` so that the round's backward still runs here."""
    return received * 0.0 + own if _on("summary_twice", rank) else received


def returned_outputs(o: torch.Tensor, rank: int, cp: int) -> torch.Tensor:
    """[B, L, cp * h, V]: this rank's tokens, every rank's heads in rank order after the inverse
    all-to-all; heads_permuted puts the ranks' blocks of heads in reversed order."""
    if not _on("heads_permuted", rank):
        return o
    B, L, H, V = o.shape
    return o.view(B, L, cp, H // cp, V).flip(2).reshape(B, L, H, V)
