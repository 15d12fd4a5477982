"""Packed documents (FLA's `cu_seqlens`): their checks, and the chunk grid in which no chunk spans two.

A packed batch is B = 1 sequence holding n documents back to back; `cu_seqlens` [n + 1] holds their
boundaries (0 = cu_seqlens[0] < ... < cu_seqlens[n] = T). The recurrent state restarts at every document
(from its own initial state, or zeros), and the Conv1D never mixes two.

Two ways to keep documents apart in the chunked op, chosen per boundary:

- a segment boundary (a document with an initial or a final state): the segment is cut into chunks from its
  own first token, and its last chunk is padded (g = 0, beta = 0: the state is untouched). A chunk then
  belongs to one segment, whose scan starts from its initial state. The padding costs at most one chunk per
  segment (FLA's kernels pay the same, chunk by chunk).
- a reset (a document without states: the state restarts from zeros and is never reported): documents
  share chunks, and constant masks keep them apart inside each chunk (`ResetMasks`): the decay Gamma between
  two tokens of different documents is 0 (so is the UT transform's coupling), only the chunk's first
  document reads the entering state, only its last writes the leaving state, and a chunk with a reset
  forgets the entering state. Nothing is padded, so packed training costs what unpacked does.
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
class ResetMasks:
    """Per chunk of the grid, what keeps the documents that share it apart (see the module docstring).

    Broadcast against [..., N, C, ...] chunk tensors."""

    same: torch.Tensor
    """[N, C, C] bool: tokens i and j belong to the same document."""
    reads: torch.Tensor
    """[N, C] float: the token belongs to the document that continues from the chunk's entering state."""
    writes: torch.Tensor
    """[N, C] float: the token belongs to the chunk's last document (it writes the leaving state)."""
    keeps: torch.Tensor
    """[N] float: no document starts in the chunk (the entering state survives to its end)."""

    def block(self, span: slice) -> ResetMasks:
        """The masks of chunks `span`."""
        return ResetMasks(self.same[span], self.reads[span], self.writes[span], self.keeps[span])


def reset_masks(reset_grid: torch.Tensor, chunk_size: int, dtype: torch.dtype) -> ResetMasks:
    """Masks from [N * C] bool (a reset at that place of the grid)."""
    marks = reset_grid.view(-1, chunk_size)
    ids = marks.long().cumsum(-1)  # document index inside each chunk (padding joins the one before)
    first = ids == ids[:, :1]
    return ResetMasks(
        same=ids[:, :, None] == ids[:, None, :],
        reads=(first & ~marks[:, :1]).to(dtype),
        writes=(ids == ids[:, -1:]).to(dtype),
        keeps=(~marks.any(-1)).to(dtype),
    )


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
    masks: ResetMasks | None = None
    """Where documents share chunks (resets), else None."""

    @property
    def num_chunks(self) -> int:
        return self.chunk_offsets[-1]

    @property
    def num_segments(self) -> int:
        return len(self.chunk_offsets) - 1

    def chunk_segments(self, device: torch.device | None = None) -> torch.Tensor:
        """[N] the segment (document) each chunk belongs to."""
        counts = torch.tensor([b - a for a, b in pairwise(self.chunk_offsets)], device=device)
        return torch.arange(self.num_segments, device=device).repeat_interleave(counts)

    def segment_starts(self, lo: int, hi: int) -> dict[int, int]:
        """{chunk - lo: segment} for the segments whose first chunk lies in [lo, hi)."""
        return {c - lo: j for j, c in enumerate(self.chunk_offsets[:-1]) if lo <= c < hi}

    def segment_ends(self, lo: int, hi: int) -> dict[int, int]:
        """{chunk - lo: segment} for the segments whose last chunk lies in [lo, hi)."""
        return {c - 1 - lo: j for j, c in enumerate(self.chunk_offsets[1:]) if lo <= c - 1 < hi}


def chunk_grid(
    bounds: Sequence[int] | None,
    seq_len: int,
    chunk_size: int,
    device: torch.device,
    resets: Sequence[int] = (),
    dtype: torch.dtype = torch.float32,
) -> ChunkGrid:
    """The grid of `seq_len` tokens in chunks of `chunk_size`: segments `bounds` (None: one) each in chunks
    of their own, and `resets` (token positions where the state restarts from zeros) masked inside chunks;
    the masks in `dtype`."""
    if bounds is None or len(bounds) == 2:
        offsets, token_index = (0, -(-seq_len // chunk_size)), None
    else:
        offsets = [0]
        for a, b in pairwise(bounds):
            offsets.append(offsets[-1] + -(-(b - a) // chunk_size))
        lengths = torch.tensor([b - a for a, b in pairwise(bounds)], device=device)
        first = (torch.tensor(offsets[:-1], device=device) * chunk_size).repeat_interleave(lengths)
        token_index = first + document_positions(bounds, device)
    masks = None
    if resets:
        at = torch.tensor(list(resets), device=device, dtype=torch.long)
        grid_at = at if token_index is None else token_index[at]
        marks = torch.zeros(offsets[-1] * chunk_size, dtype=torch.bool, device=device)
        masks = reset_masks(marks.index_fill(0, grid_at, True), chunk_size, dtype)
    return ChunkGrid(tuple(offsets), token_index, chunk_size, masks)
