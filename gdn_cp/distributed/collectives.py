"""Autograd-correct collectives for context parallelism (sequence dim 1 unless stated; ranks are group ranks).

- `all_to_all_single`: the primitive, along dim 0 with (uneven) split sizes; backward is the reverse exchange.
- `all_to_all`: scatter one dim, gather another (Ulysses: Shard(sequence) <-> Shard(head)), uneven allowed.
- `exchange_halo_with_lengths`: the tokens just before this rank's shard, from earlier ranks, for Conv1D, and
  every rank's shard length, in one all-to-all whose message sizes do not depend on the lengths.
- `all_gather_stack`: stack one tensor per rank; backward sums each rank's slot back to its owner.
- `state_chain`: the rank-to-rank recurrent state hand-off H_out = M @ H_in + S (forward r-1 -> r -> r+1,
  backward r+1 -> r -> r-1).
- `all_reduce_gradients`: sum parameter gradients over the CP group (partial on each rank under CP).
- `broadcast_module_tensors`: one rank's parameters and buffers to every rank (setup, not counted).

All of them are no-ops (or identities) on a group of one rank. Every wire transfer reports to comm_stats and
runs inside a `gdn_cp.<kind>` profiler range.
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

from gdn_cp.distributed import comm_stats


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


HEADER_DIGITS = 4
"""Elements of the length header that rides in every halo message: base-256 digits, exact in every float
dtype down to bf16 (8 significant bits), so shard lengths below 2**32 cross in the tensor's own dtype."""


def _encode_length(n: int, like: torch.Tensor) -> torch.Tensor:
    if not 0 <= n < 256**HEADER_DIGITS:
        raise ValueError(f"exchange_halo: a shard of {n} tokens does not fit the length header")
    digits = [(n >> (8 * i)) & 255 for i in range(HEADER_DIGITS)]
    return torch.tensor(digits, dtype=like.dtype, device=like.device)


def _decode_length(header: torch.Tensor) -> int:
    return sum(int(d) << (8 * i) for i, d in enumerate(header.detach().round().long().tolist()))


def exchange_halo_with_lengths(
    x: torch.Tensor, width: int, group: ProcessGroup | None = None
) -> tuple[torch.Tensor, list[int]]:
    """The last `width` tokens before this rank's shard, and every rank's shard length, in one exchange.

    Message sizes never depend on the shard lengths, so ranks that disagree about them cannot mismatch the
    exchange: every rank sends every peer a length header (HEADER_DIGITS elements), and each of the next
    `width` ranks also its last `width` tokens (zero-padded on the left when the shard is shorter). A rank
    then assembles its halo from the tails of the ranks before it, using their lengths, so a halo may span
    several earlier ranks (tiny shards) and shards may differ in length. At the sequence start the halo is
    shorter (rank 0 gets none) and causal_conv1d zero-fills what is missing. Differentiable: a token sent
    to several ranks gets the sum of their gradients.

    Args:
        x: [B, L, D] this rank's shard, before the convolution
        width: tokens of left context wanted (kernel size - 1)
    Returns:
        halo [B, min(width, tokens before this shard), D], and the shard length of every rank (one list,
        the same on every rank).
    """
    rank, size = group_rank_size(group)
    B, L, D = x.shape
    if size == 1:
        return x[:, :0], [L]
    tail = x[:, max(0, L - width) :]
    tail = torch.cat([tail.new_zeros(B, width - tail.shape[1], D), tail], dim=1)  # [B, width, D]
    header = _encode_length(L, x)
    receives_tail = [0 < peer - rank <= width for peer in range(size)]
    flat = tail.reshape(-1)
    # Header-only messages still carry an empty slice of x: every rank's exchange then needs a backward
    # when x does, so the ranks meet in it (a collective's backward is itself a collective).
    parts = [torch.cat([header, flat if t else flat[:0]]) for t in receives_tail]
    send_counts = [p.numel() for p in parts]
    recv_counts = [HEADER_DIGITS + (B * width * D if 0 < rank - peer <= width else 0) for peer in range(size)]
    received = all_to_all_single(torch.cat(parts), recv_counts, send_counts, group, kind=comm_stats.HALO)
    messages = received.split(recv_counts)
    lengths = [L if peer == rank else _decode_length(m[:HEADER_DIGITS]) for peer, m in enumerate(messages)]
    pieces, needed = [], width
    for peer in range(rank - 1, max(-1, rank - 1 - width), -1):  # newest first, then reversed
        take = min(needed, lengths[peer])
        if take:
            peer_tail = messages[peer][HEADER_DIGITS:].view(B, width, D)
            pieces.append(peer_tail[:, width - take :])
        needed -= take
        if not needed:
            break
    # Rank 0's empty halo is still a view of what arrived, so that its backward joins the exchange too.
    halo = torch.cat(pieces[::-1], dim=1) if pieces else received[:0].view(B, 0, D)
    return halo, lengths


def exchange_halo(x: torch.Tensor, width: int, group: ProcessGroup | None = None) -> torch.Tensor:
    """The halo of `exchange_halo_with_lengths` alone: [B, L, D] -> [B, min(width, tokens before), D]."""
    return exchange_halo_with_lengths(x, width, group)[0]


# torch 2.13 renamed all_gather_into_tensor to all_gather_single; older releases only have the former.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        _, size = group_rank_size(group)
        flat = x.reshape(-1).contiguous()  # gloo wants the concatenated (not stacked) output form
        out = flat.new_empty(size * flat.numel())
        moved = _nbytes(flat.numel() * (size - 1), x)
        with _on_wire(comm_stats.ALL_GATHER, moved, moved):
            _all_gather_single(out, flat, group=group)
        return out.view(size, *x.shape)

    @staticmethod
    def backward(ctx, grad):
        # Slot j of every rank's output came from rank j: send each slot home and sum what arrives.
        _, size = group_rank_size(ctx.group)
        return _exchange(grad, [1] * size, [1] * size, ctx.group, comm_stats.ALL_GATHER).sum(0), None


def all_gather_stack(x: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """Differentiable all-gather: x [...] -> [cp, ...], slot j holding rank j's x."""
    _, size = group_rank_size(group)
    if size == 1:
        return x.unsqueeze(0)
    return _AllGather.apply(x, group)


def _send(t: torch.Tensor, peer: int, group: ProcessGroup | None) -> None:
    with _on_wire(comm_stats.P2P, t.numel() * t.element_size(), 0):
        dist.send(t.contiguous(), group_dst=peer, group=group)


def _recv(like: torch.Tensor, peer: int, group: ProcessGroup | None) -> torch.Tensor:
    buf = torch.empty_like(like, memory_format=torch.contiguous_format)
    with _on_wire(comm_stats.P2P, 0, buf.numel() * buf.element_size()):
        dist.recv(buf, group_src=peer, group=group)
    return buf


class _StateChain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, S, M, group):
        rank, size = group_rank_size(group)
        h_in = torch.zeros_like(S) if rank == 0 else _recv(S, rank - 1, group)
        if rank < size - 1:
            _send(M @ h_in + S, rank + 1, group)
        ctx.save_for_backward(M, h_in)
        ctx.group = group
        return h_in

    @staticmethod
    def backward(ctx, grad_h_in):
        M, h_in = ctx.saved_tensors
        rank, size = group_rank_size(ctx.group)
        if rank == size - 1:
            grad_h_out = torch.zeros_like(h_in)
        else:
            grad_h_out = _recv(h_in, rank + 1, ctx.group)  # dL/dH_out is the next rank's dL/dH_in
        if rank > 0:
            _send(grad_h_in + M.transpose(-1, -2) @ grad_h_out, rank - 1, ctx.group)
        return grad_h_out, grad_h_out @ h_in.transpose(-1, -2), None


def state_chain(S: torch.Tensor, M: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """The state entering this rank's shard, handed rank to rank.

    Forward: receive H_in from rank r-1 (zeros on rank 0), send H_out = M @ H_in + S to rank r+1. Backward:
    receive dL/dH_out from rank r+1, send dL/dH_in = (local grad) + M^T dL/dH_out to rank r-1; dS = dL/dH_out,
    dM = dL/dH_out H_in^T. Only one [B, Hv, K, V] state crosses each hop, each way.

    Args:
        S: [B, Hv, K, V] and M: [B, Hv, K, K], this rank's summary
    Returns:
        H_in [B, Hv, K, V]
    """
    _, size = group_rank_size(group)
    if size == 1:
        return torch.zeros_like(S)
    return _StateChain.apply(S, M, group)


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
