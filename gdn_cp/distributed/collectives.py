"""Autograd-correct collectives for context parallelism (sequence dim 1 unless stated; ranks are group ranks).

- `all_to_all_single`: the primitive, along dim 0 with (uneven) split sizes; backward is the reverse exchange.
- `all_to_all`: scatter one dim, gather another (Ulysses: Shard(sequence) <-> Shard(head)), uneven allowed.
- `exchange_halos`: the tokens just before each of this rank's pieces, from earlier pieces, for Conv1D, in
  one all-to-all. `exchange_header`: every rank's int64 values (the header, gdn_cp.distributed.header), in
  one small all-gather.
- `sum_with_outputs`: a replicated sum of per-rank shares (final states), tied to the outputs.
- `all_reduce_gradients`: sum parameter gradients over the CP group (partial on each rank under CP).
- `broadcast_module_tensors`: one rank's parameters and buffers to every rank (setup, not counted).

The transfers of states and summaries that compute can overlap (state_chain, shift_pieces,
all_gather_stack) are in gdn_cp.distributed.transfers. All of them are no-ops (or identities) on a group of
one rank. Every wire transfer reports to comm_stats and runs inside a `gdn_cp.<kind>` profiler range.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor

from gdn_cp.distributed import comm_stats, mutants


def group_rank_size(group: ProcessGroup | None) -> tuple[int, int]:
    """(rank, size) of this process in `group` (None: the default group)."""
    return dist.get_rank(group), dist.get_world_size(group)


def _nbytes(numel: int, t: torch.Tensor) -> int:
    return numel * t.element_size()


PROFILER_LABEL = "gdn_cp.{kind}"
"""record_function name around every wire transfer, so that traces tell the halo from Ulysses' all-to-all."""


@contextmanager
def _on_wire(kind: str, sent: int, received: int) -> Iterator[None]:
    """Count a transfer under `kind` (comm_stats) and label it in profiler traces."""
    comm_stats.record(kind, sent, received)
    with torch.profiler.record_function(PROFILER_LABEL.format(kind=kind)):
        yield


def _exchange(
    x: torch.Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group: ProcessGroup | None,
    kind: str,
) -> torch.Tensor:
    """dist.all_to_all_single along dim 0, counted under `kind`. The result is a new tensor."""
    rank, _ = group_rank_size(group)
    x = x.contiguous()
    out = x.new_empty((sum(output_split_sizes), *x.shape[1:]))
    row = math.prod(x.shape[1:])
    sent = _nbytes(row * (sum(input_split_sizes) - input_split_sizes[rank]), x)
    received = _nbytes(row * (sum(output_split_sizes) - output_split_sizes[rank]), x)
    with _on_wire(kind, sent, received):
        dist.all_to_all_single(out, x, output_split_sizes, input_split_sizes, group=group)
    return out


class _AllToAllSingle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_split_sizes, input_split_sizes, group, kind):
        ctx.splits = (list(output_split_sizes), list(input_split_sizes))
        ctx.group, ctx.kind = group, kind
        return _exchange(x, list(output_split_sizes), list(input_split_sizes), group, kind)

    @staticmethod
    def backward(ctx, grad):
        output_split_sizes, input_split_sizes = ctx.splits
        grad_x = _exchange(grad, input_split_sizes, output_split_sizes, ctx.group, ctx.kind)
        return grad_x, None, None, None, None


def all_to_all_single(
    x: torch.Tensor,
    output_split_sizes: Sequence[int],
    input_split_sizes: Sequence[int],
    group: ProcessGroup | None = None,
    kind: comm_stats.CommKind = comm_stats.ALL_TO_ALL,
) -> torch.Tensor:
    """Differentiable all-to-all along dim 0: rows [sum(in[:j]), sum(in[:j+1])) go to rank j, and the rows
    received from rank j land at [sum(out[:j]), sum(out[:j+1])). Sizes may differ per peer, and be zero.

    Args:
        x: [sum(input_split_sizes), ...]
        kind: the name its bytes are counted under (gdn_cp.distributed.comm_stats)
    Returns:
        [sum(output_split_sizes), ...]
    """
    return _AllToAllSingle.apply(x, list(output_split_sizes), list(input_split_sizes), group, kind)


def all_to_all(
    x: torch.Tensor,
    scatter_dim: int,
    gather_dim: int,
    group: ProcessGroup | None = None,
    scatter_sizes: Sequence[int] | None = None,
    gather_sizes: Sequence[int] | None = None,
) -> torch.Tensor:
    """Split x along `scatter_dim`, send part j to rank j, and concatenate what arrives along `gather_dim`
    in rank order. Differentiable; the backward is the inverse exchange.

    Ulysses: [B, T/cp, H, D] with scatter_dim=2, gather_dim=1 -> [B, T, H/cp, D], and back with the dims
    swapped.

    Args:
        x: any shape
        scatter_sizes: sizes of the parts along scatter_dim, one per rank (default: equal parts)
        gather_sizes: each rank's size along gather_dim (default: all equal to x's), for uneven shards
    Returns:
        x's shape with scatter_dim -> scatter_sizes[rank] and gather_dim -> sum(gather_sizes).
    """
    rank, size = group_rank_size(group)
    if size == 1:
        return x
    scatter_dim %= x.dim()
    gather_dim %= x.dim()
    if scatter_sizes is None:
        if x.shape[scatter_dim] % size:
            raise ValueError(
                f"all_to_all: dim {scatter_dim} of size {x.shape[scatter_dim]} does not split over "
                f"{size} ranks; pass scatter_sizes"
            )
        scatter_sizes = [x.shape[scatter_dim] // size] * size
    gather_sizes = list(gather_sizes) if gather_sizes is not None else [x.shape[gather_dim]] * size
    if len(scatter_sizes) != size or len(gather_sizes) != size:
        raise ValueError(f"all_to_all: need one scatter and one gather size per rank ({size})")

    # Every part travels flattened, so parts of different shapes share one all_to_all_single.
    parts = x.split(list(scatter_sizes), dim=scatter_dim)
    send = torch.cat([p.reshape(-1) for p in parts])
    shapes = []
    for src in range(size):
        shape = list(x.shape)
        shape[scatter_dim] = scatter_sizes[rank]
        shape[gather_dim] = gather_sizes[src]
        shapes.append(shape)
    recv_numels = [torch.Size(s).numel() for s in shapes]
    recv = all_to_all_single(send, recv_numels, [p.numel() for p in parts], group)
    received = [r.view(s) for r, s in zip(recv.split(recv_numels), shapes, strict=True)]
    return torch.cat(received, dim=gather_dim)


# torch 2.13 renamed all_gather_into_tensor to all_gather_single; older releases only have the former.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _left_padded_tail(x: torch.Tensor, width: int) -> torch.Tensor:
    """The last `width` tokens of x [B, L, D], zero-padded on the left when L < width: [B, width, D]."""
    tail = x[:, max(0, x.shape[1] - width) :]
    return torch.cat([tail.new_zeros(tail.shape[0], width - tail.shape[1], tail.shape[2]), tail], dim=1)


def wants_tail(owners: Sequence[int], width: int, peer: int, piece: int) -> bool:
    """Does rank `peer` get `piece`'s tail in the halo exchange? When it holds one of the `width` pieces after
    it and is not its holder (the rule of `exchange_halos`, and of its communication model)."""
    return peer != owners[piece] and peer in owners[piece + 1 : piece + 1 + width]


def exchange_halos(
    pieces: Sequence[torch.Tensor],
    width: int,
    lengths: Sequence[int],
    group: ProcessGroup | None = None,
    owners: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """The `width` tokens before each of this rank's pieces of the sequence, in one all-to-all.

    The global sequence is cut into pieces held by `owners` (global order; default: piece r on rank r) whose
    lengths every rank knows (`lengths`, from the header: gdn_cp.distributed.header); this rank passes its
    pieces in increasing global order. For each piece it holds, a rank sends the piece's last `width` tokens
    (zero-padded on the left when shorter) to every other rank holding one of the next `width` pieces; each
    rank then assembles its halos from the tails before them, so a halo may span several earlier pieces
    (tiny shards). At the sequence start a halo is shorter (the first piece gets none) and causal_conv1d
    zero-fills what is missing. Differentiable: a token sent to several ranks gets the sum of their gradients.

    Args:
        pieces: [B, L_p, D] this rank's pieces, before the convolution
        width: tokens of left context wanted (kernel size - 1)
        lengths: of every global piece, in global order
    Returns:
        one halo [B, <= width, D] per piece
    """
    rank, size = group_rank_size(group)
    owners = list(range(size)) if owners is None else list(owners)
    mine = [j for j, owner in enumerate(owners) if owner == rank]
    if len(mine) != len(pieces) or [lengths[j] for j in mine] != [p.shape[1] for p in pieces]:
        raise ValueError("exchange_halos: one piece per owned slot, of the length `lengths` gives it")
    B, _, D = pieces[0].shape
    if size == 1:
        return [p[:, :0] for p in pieces]

    tails, received = _exchange_tails(pieces, mine, owners, width, group)
    halos = []
    for j in mine:
        before = _tails_before(j, tails, lengths, width)
        # The first piece's empty halo is still a view of what arrived, so that its backward joins the
        # exchange too.
        halos.append(torch.cat(before, dim=1) if before else received[:0].view(B, 0, D))
    if mutants.ACTIVE is not None:  # a test's mutation of what arrived (gdn_cp.distributed.mutants)
        halos = mutants.halos(halos, rank)
    return halos


def _exchange_tails(
    pieces: Sequence[torch.Tensor],
    mine: list[int],
    owners: list[int],
    width: int,
    group: ProcessGroup | None,
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """(piece -> tail [B, width, D], this rank's and those it receives; the flat message received)."""
    rank, size = group_rank_size(group)
    B, _, D = pieces[0].shape
    tails = {j: _left_padded_tail(p, width) for j, p in zip(mine, pieces, strict=True)}
    # Every message holds an empty slice of a piece at least: every rank's exchange then needs a backward when
    # the pieces do, so the ranks meet in it (a collective's backward is itself a collective).
    empty = pieces[0].reshape(-1)[:0]
    parts = [
        torch.cat([empty, *(tails[j].reshape(-1) for j in mine if wants_tail(owners, width, peer, j))])
        for peer in range(size)
    ]
    tail_numel = B * width * D
    recv_counts = [
        tail_numel * sum(wants_tail(owners, width, rank, j) for j, o in enumerate(owners) if o == peer)
        for peer in range(size)
    ]
    received = all_to_all_single(
        torch.cat(parts), recv_counts, [p.numel() for p in parts], group, kind=comm_stats.HALO
    )
    for peer, message in enumerate(received.split(recv_counts)):
        wanted = [j for j, o in enumerate(owners) if o == peer and wants_tail(owners, width, rank, j)]
        for at, j in enumerate(wanted):
            tails[j] = message[at * tail_numel : (at + 1) * tail_numel].view(B, width, D)
    return tails, received


def _tails_before(
    j: int, tails: dict[int, torch.Tensor], lengths: Sequence[int], width: int
) -> list[torch.Tensor]:
    """The slices [B, <= width, D] of earlier pieces' tails that make up piece j's halo, oldest first."""
    parts_before, needed = [], width
    for i in range(j - 1, max(-1, j - 1 - width), -1):  # newest first, then reversed
        take = min(needed, lengths[i])
        if take:
            parts_before.append(tails[i][:, width - take :])
        needed -= take
        if not needed:
            break
    return parts_before[::-1]


def exchange_halo(x: torch.Tensor, width: int, group: ProcessGroup | None = None) -> torch.Tensor:
    """The halo of contiguous shards of any lengths: [B, L, D] -> [B, min(width, tokens before this shard),
    D] (the shards' lengths by one header all-gather, then `exchange_halos`)."""
    lengths = [h[0] for h in exchange_header([x.shape[1]], group, x.device)]
    return exchange_halos([x], width, lengths, group)[0]


def exchange_header(
    values: Sequence[int], group: ProcessGroup | None, device: torch.device
) -> list[list[int]]:
    """Every rank's `values` (int64, the same count on every rank), by one all-gather: the header of the modes
    whose first exchange cannot carry it (its sizes depend on it)."""
    _, size = group_rank_size(group)
    if size == 1:
        return [list(values)]
    mine = torch.tensor(list(values), dtype=torch.int64, device=device)
    out = mine.new_empty(size * mine.numel())
    moved = _nbytes(mine.numel() * (size - 1), mine)
    with _on_wire(comm_stats.ALL_GATHER, moved, moved):
        all_gather_single(out, mine, group=group)
    return out.view(size, -1).tolist()


class _SharedWithOutputs(torch.autograd.Function):
    """Sums `part` over the group, tied to `o` so that the backward's all-reduce runs on every rank whose
    loss reads o, even where the sum itself is unused (an unused output would otherwise leave a rank out of
    a collective its peers wait in)."""

    @staticmethod
    def forward(ctx, o, part, group):
        ctx.group = group
        total = part.detach().clone().contiguous()
        with _on_wire(comm_stats.ALL_REDUCE, _nbytes(total.numel(), total), _nbytes(total.numel(), total)):
            dist.all_reduce(total, group=group)
        return o.view_as(o), total

    @staticmethod
    def backward(ctx, d_o, d_total):
        # Autograd materialises an unused result's gradient as zeros, so every rank joins with its shape.
        d_part = d_total.clone().contiguous()
        with _on_wire(
            comm_stats.ALL_REDUCE, _nbytes(d_part.numel(), d_part), _nbytes(d_part.numel(), d_part)
        ):
            dist.all_reduce(d_part, group=ctx.group)
        return d_o, d_part, None


def sum_with_outputs(
    o: torch.Tensor, part: torch.Tensor, group: ProcessGroup | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, the sum of `part` over the group), differentiable: the replicated result of contributions each
    rank holds a share of (CP's final states: each document's on the rank holding its last token, zeros
    elsewhere). The gradient of a rank's share is the sum of every rank's gradient of the result."""
    _, size = group_rank_size(group)
    if size == 1:
        return o, part
    return _SharedWithOutputs.apply(o, part, group)


def all_reduce_gradients(parameters: Iterable[torch.nn.Parameter], group: ProcessGroup | None = None) -> None:
    """Sum .grad over the group, in place: under CP each rank holds a partial gradient, and their sum is
    the single-device gradient. One all-reduce per dtype (gradients are flattened together)."""
    _, size = group_rank_size(group)
    if size == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        with _on_wire(comm_stats.ALL_REDUCE, _nbytes(flat.numel(), flat), _nbytes(flat.numel(), flat)):
            dist.all_reduce(flat, group=group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def broadcast_module_tensors(module: nn.Module, group: ProcessGroup, src: int) -> None:
    """Overwrite every plain parameter and buffer of `module` with global rank `src`'s, in place: a setup
    step (ParallelStyle's src_data_rank), not part of a step, so not counted in comm_stats.

    DTensors are left alone (their placements already say what each rank holds), and so are meta tensors
    (nothing to send; torchtitan materialises and initialises them after parallelising).
    """
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            if isinstance(tensor, DTensor) or tensor.is_meta:
                continue
            buf = tensor.detach()
            wire = buf.contiguous()
            dist.broadcast(wire, src=src, group=group)
            if wire.data_ptr() != buf.data_ptr():
                buf.copy_(wire)
