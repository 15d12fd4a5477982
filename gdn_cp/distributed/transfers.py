"""Transfers of states and summaries between the pieces of a sequence, each split in two phases so that
compute can run while its messages are in flight (the overlap of the sequence-shard modes).

A `Transfer` posts its messages in `start` (dist.batch_isend_irecv, or a collective with async_op=True) and
waits for them in `finish`, which then does whatever depends on their arrival; its backward has the same two
phases the other way (`start_backward` in the backward of the finish, `finish_backward` in the backward of the
start). `finish` hands its result to autograd and keeps no reference to it: the result's grad_fn holds the
transfer, so a transfer holding its result would be a reference cycle through autograd's C++ nodes, which
not even the cycle collector frees (the graph and its saved activations then lived forever: a p2p forward
grew 18 MB a pass). What the backward needs of the result comes back saved (`start_backward`'s `result`).
`begin(transfer, *inputs)` runs the start and returns an `InFlight` whose `wait()` runs the finish:

    pending = begin_state_chain(S, M, group, owners)   # messages posted
    ...                                               # compute that does not need H_in
    h_in = pending.wait()                             # [P, B, Hv, K, V]

Autograd sees two nodes, start and finish, joined by an empty token. Its engine runs a node as soon as its
gradients are in, later-created nodes first, so in backward the finish's node (posting the gradient's
messages) runs before the backward of whatever was computed between the two phases, and the start's node
(waiting for them) after it: the backward overlaps too. Called back to back (`state_chain`, `shift_pieces`,
`all_gather_stack`) the two phases are the plain, blocking transfer.

Profiling: posting runs inside a `gdn_cp.<kind>` range flagged as posted (POSTED_SUFFIX), and every wait in a
`gdn_cp.wait.<kind>` range (WAIT_LABEL): bench.profiling.traces counts the posting as the collective's time
and the wait, during which the rank can do nothing, as waiting.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from gdn_cp.distributed import comm_stats, mutants
from gdn_cp.distributed.collectives import PROFILER_LABEL, all_gather_single, group_rank_size

POSTED_SUFFIX = ":posted"
"""Ends the profiler range of a transfer's posting: its c10d ops return at once, the data moves later."""
WAIT_LABEL = "gdn_cp.wait.{kind}"
"""The profiler range of the wait for a posted transfer."""


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Transfer(ABC):
    """A differentiable exchange in two phases each way (module docstring). One object per call: the phases
    keep their pending works and buffers on it."""

    kind: comm_stats.CommKind

    def __init__(self, group: ProcessGroup | None) -> None:
        self.group = group
        self.rank, self.size = group_rank_size(group)
        self._works: list[dist.Work] = []

    # -- helpers for the phases ------------------------------------------------------------------------

    @contextmanager
    def _posting(self) -> Iterator[None]:
        with torch.profiler.record_function(PROFILER_LABEL.format(kind=self.kind) + POSTED_SUFFIX):
            yield

    def _p2p(
        self, sends: Sequence[tuple[torch.Tensor, int]], recvs: Sequence[tuple[torch.Tensor, int]]
    ) -> None:
        """Post point-to-point messages: (tensor, peer) to send, (buffer, peer) to receive into."""
        ops = []
        for t, peer in sends:
            ops.append(dist.P2POp(dist.isend, t, group=self.group, group_peer=peer))
            comm_stats.record(self.kind, _bytes(t), 0)
        for buf, peer in recvs:
            ops.append(dist.P2POp(dist.irecv, buf, group=self.group, group_peer=peer))
            comm_stats.record(self.kind, 0, _bytes(buf))
        if ops:
            with self._posting():
                self._works.extend(dist.batch_isend_irecv(ops))

    def _wait(self) -> None:
        """Wait for every posted work (sends included: their tensors may be reused after)."""
        works, self._works = self._works, []
        if works:
            with torch.profiler.record_function(WAIT_LABEL.format(kind=self.kind)):
                for work in works:
                    work.wait()

    # -- the phases ------------------------------------------------------------------------------------

    @abstractmethod
    def start(self, *inputs: torch.Tensor) -> None:
        """Post what can be sent before anything arrives."""

    @abstractmethod
    def finish(self) -> torch.Tensor:
        """Wait, and compute the result (a new tensor, not kept on the transfer: module docstring)."""

    @abstractmethod
    def start_backward(self, grad: torch.Tensor, result: torch.Tensor) -> None:
        """Post the backward's first messages, given the result's gradient and the result."""

    @abstractmethod
    def finish_backward(self) -> tuple[torch.Tensor | None, ...]:
        """Wait, and return the gradients of `start`'s inputs."""


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx, transfer, *inputs):
        ctx.transfer = transfer
        transfer.start(*(x.detach() for x in inputs))
        return inputs[0].new_empty(0)  # the token: orders the finish after the start, in both directions

    @staticmethod
    def backward(ctx, _token_grad):
        return (None, *ctx.transfer.finish_backward())


class _Finish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, transfer, token):
        ctx.transfer = transfer
        result = transfer.finish()
        ctx.save_for_backward(result)  # autograd's way to keep an output: no reference cycle
        return result

    @staticmethod
    def backward(ctx, grad):
        (result,) = ctx.saved_tensors
        ctx.transfer.start_backward(grad.contiguous(), result)
        return None, grad.new_empty(0)


class InFlight:
    """A transfer whose messages are posted; `wait()` completes it, once, and returns its result (after the
    steps added by `then`, which run when it is waited for)."""

    def __init__(
        self, transfer: Transfer | None, token: torch.Tensor | None, ready: torch.Tensor | None = None
    ):
        self._transfer, self._token, self._result = transfer, token, ready
        self._steps: list[Callable[[torch.Tensor], torch.Tensor]] = []

    @classmethod
    def done(cls, result: torch.Tensor) -> InFlight:
        """A transfer with nothing to move (a group of one rank)."""
        return cls(None, None, result)

    def then(self, step: Callable[[torch.Tensor], torch.Tensor]) -> InFlight:
        """Apply `step` to the result once it has arrived (in `wait`); returns self."""
        self._steps.append(step)
        return self

    def wait(self) -> torch.Tensor:
        if self._transfer is not None:
            self._result = _Finish.apply(self._transfer, self._token)
            self._transfer = self._token = None
        for step in self._steps:
            self._result = step(self._result)
        self._steps = []
        return self._result


def begin(transfer: Transfer, *inputs: torch.Tensor) -> InFlight:
    """Run `transfer`'s start phase on `inputs` (differentiably) and return it in flight."""
    return InFlight(transfer, _Start.apply(transfer, *inputs))


# -----------------------------------------------------------------------------------------------------------
# the state chain (p2p)


class StateChain(Transfer):
    """H_in of every piece held here, handed piece to piece in global order: H_out = M @ H_in + S.

    Forward: the holder of piece j receives H_in from the holder of j-1 (zeros for piece 0) and sends H_out
    on. Only a rank's first piece can be posted at the start (its H_out is S when it is piece 0; otherwise its
    H_in is awaited); the rest of the chain runs in `finish`. Backward, in reverse: dL/dH_out comes from the
    holder of j+1 and dL/dH_in = (local grad) + M^T dL/dH_out goes back; dS = dL/dH_out,
    dM = dL/dH_out H_in^T.
    """

    kind = comm_stats.P2P

    def __init__(self, group: ProcessGroup | None, owners: Sequence[int]) -> None:
        super().__init__(group)
        self.owners = tuple(owners)
        self.mine = [j for j, owner in enumerate(self.owners) if owner == self.rank]

    def _elsewhere(self, j: int) -> bool:
        """Is global piece j (when it exists) held by another rank?"""
        return 0 <= j < len(self.owners) and self.owners[j] != self.rank

    def start(self, S: torch.Tensor, M: torch.Tensor) -> None:
        self.S, self.M = S, M
        self.h_in = torch.zeros_like(S)
        first = self.mine[0]
        if first == 0:
            self.leaving = S[0].contiguous()  # H_in is zero: H_out = S
            if self._elsewhere(1):
                self._p2p([(self.leaving, self.owners[1])], [])
        elif self._elsewhere(first - 1):
            self._p2p([], [(self.h_in[0], self.owners[first - 1])])

    def finish(self) -> torch.Tensor:
        self._wait()
        S, M, h_in = self.S, self.M, self.h_in
        del self.S, self.h_in  # the backward needs M, and H_in (the result) comes back saved
        previous = self.leaving if self.mine[0] == 0 else None
        for at, j in enumerate(self.mine):
            if at == 0 and j == 0:
                continue  # sent at the start
            if at > 0:
                if self.owners[j - 1] == self.rank:
                    h_in[at] = previous
                else:
                    self._p2p([], [(h_in[at], self.owners[j - 1])])
                    self._wait()
            previous = (M[at] @ h_in[at] + S[at]).contiguous()
            if self._elsewhere(j + 1):
                self._p2p([(previous, self.owners[j + 1])], [])
                self._wait()
        return h_in

    def start_backward(self, grad: torch.Tensor, result: torch.Tensor) -> None:
        # detached: the saved result unpacks with this transfer's node as its grad_fn (a cycle again)
        self.grad, self.h_in = grad, result.detach()
        self.d_out = torch.zeros_like(grad)  # dL/dH_out of each piece here
        last = self.mine[-1]
        if last == len(self.owners) - 1:
            self.later = grad[-1].contiguous()  # nothing after the last piece: dL/dH_in is the local grad
            if self._elsewhere(last - 1):
                self._p2p([(self.later, self.owners[last - 1])], [])
        elif self._elsewhere(last + 1):
            self._p2p([], [(self.d_out[-1], self.owners[last + 1])])

    def finish_backward(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._wait()
        M, h_in, grad, d_out = self.M, self.h_in, self.grad, self.d_out
        later = self.later if self.mine[-1] == len(self.owners) - 1 else None
        for at in range(len(self.mine) - 1, -1, -1):
            j = self.mine[at]
            if at == len(self.mine) - 1 and j == len(self.owners) - 1:
                continue  # sent at the start; its dL/dH_out is zero
            if at < len(self.mine) - 1:
                if self.owners[j + 1] == self.rank:
                    d_out[at] = later
                else:
                    self._p2p([], [(d_out[at], self.owners[j + 1])])
                    self._wait()
            later = (grad[at] + M[at].transpose(-1, -2) @ d_out[at]).contiguous()
            if self._elsewhere(j - 1):
                self._p2p([(later, self.owners[j - 1])], [])
                self._wait()
        return d_out, d_out @ h_in.transpose(-1, -2)


def begin_state_chain(
    S: torch.Tensor, M: torch.Tensor, group: ProcessGroup | None = None, owners: Sequence[int] | None = None
) -> InFlight:
    """`state_chain`, started: wait() returns H_in [P, B, Hv, K, V]."""
    rank, size = group_rank_size(group)
    owners = tuple(range(size)) if owners is None else tuple(owners)
    if size == 1 and len(owners) == 1:
        return InFlight.done(torch.zeros_like(S))
    pending = begin(StateChain(group, owners), S, M)
    if mutants.ACTIVE is not None:  # a test's mutation of what arrives (gdn_cp.distributed.mutants)
        pending.then(lambda h_in: mutants.entering_states(h_in, rank))
    return pending


def state_chain(
    S: torch.Tensor, M: torch.Tensor, group: ProcessGroup | None = None, owners: Sequence[int] | None = None
) -> torch.Tensor:
    """The state entering each of this rank's pieces, handed from piece to piece in global order (StateChain).
    One [B, Hv, K, V] state crosses each hop, each way.

    Args:
        S: [P, B, Hv, K, V] and M: [P, B, Hv, K, K], the summaries of this rank's P pieces (increasing order)
        owners: the rank holding each global piece (default: piece r on rank r)
    Returns:
        H_in [P, B, Hv, K, V]
    """
    return begin_state_chain(S, M, group, owners).wait()


# -----------------------------------------------------------------------------------------------------------
# the piece shift (the rounds of scan)


class PieceShift(Transfer):
    """y[v] = x[v - distance] for each piece v held here (zeros where v - distance is no piece); a piece
    passed to its own holder locally. All messages are posted at the start. Backward: the shift the other
    way."""

    kind = comm_stats.P2P

    def __init__(self, group: ProcessGroup | None, owners: Sequence[int], distance: int) -> None:
        super().__init__(group)
        self.owners, self.distance = tuple(owners), distance
        self.mine = [j for j, owner in enumerate(self.owners) if owner == self.rank]

    def _shift(self, x: torch.Tensor, distance: int) -> None:
        at = {j: i for i, j in enumerate(self.mine)}
        self.out = torch.zeros_like(x, memory_format=torch.contiguous_format)
        sends, recvs = [], []
        for i, j in enumerate(self.mine):
            target, source = j + distance, j - distance
            if 0 <= target < len(self.owners):
                if self.owners[target] == self.rank:
                    self.out[at[target]] = x[i]
                else:
                    sends.append((x[i].contiguous(), self.owners[target]))
            if 0 <= source < len(self.owners) and self.owners[source] != self.rank:
                recvs.append((self.out[i], self.owners[source]))
        self._p2p(sends, recvs)

    def start(self, x: torch.Tensor) -> None:
        self._shift(x, self.distance)

    def finish(self) -> torch.Tensor:
        self._wait()
        out, self.out = self.out, None
        return out

    def start_backward(self, grad: torch.Tensor, result: torch.Tensor) -> None:
        self._shift(grad, -self.distance)  # y[v] = x[v - d], so dx[v] = dy[v + d]

    def finish_backward(self) -> tuple[torch.Tensor]:
        self._wait()
        return (self.out,)


def begin_shift_pieces(
    x: torch.Tensor, distance: int, group: ProcessGroup | None = None, owners: Sequence[int] | None = None
) -> InFlight:
    """`shift_pieces`, started: wait() returns [P, ...]."""
    _, size = group_rank_size(group)
    owners = tuple(range(size)) if owners is None else tuple(owners)
    return begin(PieceShift(group, owners, distance), x)


def shift_pieces(
    x: torch.Tensor, distance: int, group: ProcessGroup | None = None, owners: Sequence[int] | None = None
) -> torch.Tensor:
    """y[v] = x[v - distance] for each of this rank's pieces v (zeros where v - distance is no piece), over
    the pieces of the global sequence held by `owners` (default: piece r on rank r). One round of
    point-to-point messages. Differentiable: the backward is the shift the other way.

    Args:
        x: [P, ...] one tensor per piece of this rank, in increasing global order
    Returns:
        [P, ...]
    """
    return begin_shift_pieces(x, distance, group, owners).wait()


# -----------------------------------------------------------------------------------------------------------
# the all-gather (all_gather)


class AllGatherStack(Transfer):
    """Every rank's x stacked, slot j holding rank j's. Backward: each slot sent home (an all-to-all) and
    summed there."""

    kind = comm_stats.ALL_GATHER

    def start(self, x: torch.Tensor) -> None:
        self.shape = x.shape
        flat = x.reshape(-1).contiguous()  # gloo wants the concatenated (not stacked) output form
        self.out = flat.new_empty(self.size * flat.numel())
        moved = _bytes(flat) * (self.size - 1)
        comm_stats.record(self.kind, moved, moved)
        with self._posting():
            self._works.append(all_gather_single(self.out, flat, group=self.group, async_op=True))

    def finish(self) -> torch.Tensor:
        self._wait()
        out, self.out = self.out, None
        return out.view(self.size, *self.shape)

    def start_backward(self, grad: torch.Tensor, result: torch.Tensor) -> None:
        self.home = torch.empty_like(grad)
        moved = _bytes(grad[0]) * (self.size - 1)
        comm_stats.record(self.kind, moved, moved)
        with self._posting():
            self._works.append(dist.all_to_all_single(self.home, grad, group=self.group, async_op=True))

    def finish_backward(self) -> tuple[torch.Tensor]:
        self._wait()
        return (self.home.sum(0),)


def begin_all_gather_stack(x: torch.Tensor, group: ProcessGroup | None = None) -> InFlight:
    """`all_gather_stack`, started: wait() returns [cp, ...]."""
    _, size = group_rank_size(group)
    if size == 1:
        return InFlight.done(x.unsqueeze(0))
    return begin(AllGatherStack(group), x)


def all_gather_stack(x: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """Differentiable all-gather: x [...] -> [cp, ...], slot j holding rank j's x; the backward sums each
    rank's gradient of slot j back at rank j."""
    return begin_all_gather_stack(x, group).wait()
