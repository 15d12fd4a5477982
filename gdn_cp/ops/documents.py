"""Packed documents (FLA's `cu_seqlens`): their checks, and the chunk grid in which no chunk spans two.

A packed batch is B = 1 sequence holding n documents back to back; `cu_seqlens` [n + 1] holds their
boundaries (0 = cu_seqlens[0] < ... < cu_seqlens[n] = T). The recurrent state restarts at every document
(from its own initial state, or zeros), and the Conv1D never mixes two.

The chunked op lays the tokens out document by document: each document is cut into chunks from its own
first token, and its last chunk is padded (g = 0, beta = 0: the state is untouched). A chunk then belongs to
one document, its scan starts from that document's initial state, and nothing crosses a boundary. The
padding costs at most one chunk per document (FLA's kernels pay the same, chunk by chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch


def document_bounds(
    cu_seqlens: torch.Tensor | Sequence[int], total: int, name: str = "cu_seqlens"
) -> list[int]:
    """The boundaries as Python ints, after checking them against a sequence of `total` tokens.

    Raises ValueError naming `name` and the fix: not 1-D integers, fewer than two entries, not starting at 0,
    not strictly increasing, or not ending at `total`.
    """
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
            raise ValueError(
                f"{name} must be a 1-D integer tensor [n + 1] (a LongTensor of document boundaries), got "
                f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}"
            )
        bounds = [int(b) for b in cu_seqlens.tolist()]
    else:
        bounds = [int(b) for b in cu_seqlens]
    if len(bounds) < 2:
        raise ValueError(f"{name} must hold n + 1 >= 2 boundaries [0, ..., T], got {bounds}")
    if bounds[0] != 0:
        raise ValueError(f"{name} must start at 0, got {bounds[0]}: it holds every document's start, then T")
    steps = [b - a for a, b in pairwise(bounds)]
    if min(steps) <= 0:
        at = steps.index(min(steps))
        raise ValueError(
            f"{name} must be strictly increasing (every document holds >= 1 token); entries {at} and "
            f"{at + 1} are {bounds[at]} and {bounds[at + 1]}: drop empty documents"
        )
    if bounds[-1] != total:
        raise ValueError(
            f"{name} must end at the sequence length T = {total}, got {bounds[-1]}: the documents must cover "
            "the whole packed sequence (pad the last one)"
        )
    return bounds


def check_packed_batch(batch: int, name: str = "cu_seqlens") -> None:
    """ValueError unless the batch is one packed sequence (FLA's rule for `cu_seqlens`)."""
    if batch != 1:
        raise ValueError(
            f"with {name}, the batch must be one packed sequence (B = 1), got B = {batch}: concatenate the "
            f"sequences along T and describe them in {name}"
        )


def document_positions(bounds: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """[T] the index of every token inside its document (0 at each document's first token)."""
    lengths = torch.tensor([b - a for a, b in pairwise(bounds)], device=device)
    starts = torch.tensor(bounds[:-1], device=device).repeat_interleave(lengths)
    return torch.arange(bounds[-1], device=device) - starts


@dataclass(frozen=True, slots=True)
class ChunkGrid:
    """Where the tokens of packed documents sit once every document is cut into chunks of its own.

    `chunk_offsets` [n + 1]: document j owns chunks [chunk_offsets[j], chunk_offsets[j + 1]). `token_index`
    [T]: the position of every token in the flattened chunk grid [N * C], or None where the grid is the plain
    sequence padded at its end (one document).
    """

    chunk_offsets: tuple[int, ...]
    token_index: torch.Tensor | None
    chunk_size: int

    @property
    def num_chunks(self) -> int:
        return self.chunk_offsets[-1]

    @property
    def num_segments(self) -> int:
        return len(self.chunk_offsets) - 1

    def segment_starts(self, lo: int, hi: int) -> dict[int, int]:
        """{chunk - lo: segment} for the segments whose first chunk lies in [lo, hi)."""
        return {c - lo: j for j, c in enumerate(self.chunk_offsets[:-1]) if lo <= c < hi}

    def segment_ends(self, lo: int, hi: int) -> dict[int, int]:
        """{chunk - lo: segment} for the segments whose last chunk lies in [lo, hi)."""
        return {c - 1 - lo: j for j, c in enumerate(self.chunk_offsets[1:]) if lo <= c - 1 < hi}


def chunk_grid(
    bounds: Sequence[int] | None, seq_len: int, chunk_size: int, device: torch.device
) -> ChunkGrid:
    """The grid of `seq_len` tokens in chunks of `chunk_size`, documents `bounds` (None: one document)."""
    if bounds is None or len(bounds) == 2:
        return ChunkGrid((0, -(-seq_len // chunk_size)), None, chunk_size)
    offsets = [0]
    for a, b in pairwise(bounds):
        offsets.append(offsets[-1] + -(-(b - a) // chunk_size))
    lengths = torch.tensor([b - a for a, b in pairwise(bounds)], device=device)
    first = (torch.tensor(offsets[:-1], device=device) * chunk_size).repeat_interleave(lengths)
    return ChunkGrid(tuple(offsets), first + document_positions(bounds, device), chunk_size)
