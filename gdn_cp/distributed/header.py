"""The header every CP rank sends the others before anything depends on the split, so that all of them agree
on the call, or all of them raise the same ValueError together (never a mismatched collective, a hang or a
silently wrong result).

One fixed-size int64 all-gather, the first exchange of every mode and call (its size depends on nothing a
rank was given), carries per rank:

    [problem, cu_seqlens fingerprint, piece lengths (2 slots), CallSignature fields ...]

- problem: whether this rank's own input failed its local checks (its error is raised on that rank, a
  pointer to it on the others);
- the fingerprint of its cu_seqlens (global document boundaries, which must be the same tensor everywhere);
- its piece lengths (1 piece contiguous, 2 zigzag: gdn_cp.distributed.layout), from which every rank
  derives the same ShardPlan;
- the CallSignature: what every rank must pass alike (mode, layout, head counts and dims, dtype, checkpoint,
  overlap, backend, chunk size, ...). A field that differs is named with every rank's value.

Every rank applies the same checks to the same values (`agree`), in that order: problems, signature,
fingerprints, the split.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gdn_cp.distributed import mutants
from gdn_cp.distributed.layout import (
    ShardPlan,
    check_zigzag_split,
    piece_owners,
    pieces_per_rank,
    split_pieces,
)
from gdn_cp.ops import check_packed_batch, document_bounds

PIECE_SLOTS = 2
"""Piece lengths per rank in the header, whatever the layout (the most any layout holds: zigzag's 2)."""
TEXT_WORDS = 4
"""int64 words per text field of the signature: 32 bytes of ASCII, zero-padded (a registered backend's name
may be long)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSignature:
    """What every CP rank of a group must pass alike to one call. Fields that do not apply are left at
    their defaults, the same on every rank."""

    mode: str
    layout: str
    checkpoint_summary: bool
    overlap: bool
    backend: str
    """The local op's name (gdn_cp.ops.backends), as the mode resolved it."""
    batch: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    dtype: str
    """The inputs' dtype (torch's name without the prefix: float32, bfloat16)."""
    chunk_size: int
    hidden_size: int = 0
    """The layer's (0 for the op-level call)."""
    conv_kernel_size: int = 0
    """The layer's (0 for the op-level call)."""
    initial_state: bool = False
    """The op-level call was given initial states."""
    output_final_state: bool = False
    use_qk_l2norm_in_kernel: bool = True
    scale: float = 0.0
    """The op's scale (0: the default K^-1/2)."""

    def encode(self) -> list[int]:
        """The fields as int64 words (text in TEXT_WORDS words, floats by their bits)."""
        words: list[int] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, str):
                raw = value.encode("ascii")[: 8 * TEXT_WORDS].ljust(8 * TEXT_WORDS, b"\0")
                words += [
                    int.from_bytes(raw[8 * i : 8 * i + 8], "little", signed=True) for i in range(TEXT_WORDS)
                ]
            elif isinstance(value, float):
                words.append(struct.unpack("<q", struct.pack("<d", value))[0])
            else:
                words.append(int(value))
        return words

    @classmethod
    def decode(cls, words: Sequence[int]) -> dict[str, object]:
        """The fields of `encode(words)`, by name (the values as they were, text and floats included)."""
        out: dict[str, object] = {}
        at = 0
        for field in dataclasses.fields(cls):
            kind = field.type  # a string: annotations are postponed (PEP 563)
            if kind == "str":
                raw = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words[at : at + TEXT_WORDS])
                out[field.name] = raw.rstrip(b"\0").decode("ascii", errors="replace")
                at += TEXT_WORDS
            elif kind == "float":
                out[field.name] = struct.unpack("<d", struct.pack("<q", int(words[at])))[0]
                at += 1
            else:
                out[field.name] = bool(words[at]) if kind == "bool" else int(words[at])
                at += 1
        return out

    @classmethod
    def words(cls) -> int:
        """int64 words of an encoded signature."""
        return sum(TEXT_WORDS if f.type == "str" else 1 for f in dataclasses.fields(cls))


def header_words() -> int:
    """int64 words one rank sends in the header (the same for every call)."""
    return 2 + PIECE_SLOTS + CallSignature.words()


def fingerprint(bounds: Sequence[int] | None) -> int:
    """A 32-bit fingerprint of document boundaries (0 for None), for ranks to compare cheaply."""
    if bounds is None:
        return 0
    return zlib.crc32(",".join(str(int(b)) for b in bounds).encode()) or 1


@dataclass(frozen=True, slots=True)
class LocalShard:
    """What one rank knows before the header exchange."""

    piece_lengths: tuple[int, ...]
    documents: int
    """The fingerprint of its cu_seqlens (`fingerprint`)."""
    problem: str | None
    """The first error its own input raised in local checks, or None."""
    signature: CallSignature

    def header(self) -> list[int]:
        """This rank's header words (module docstring)."""
        pieces = list(self.piece_lengths) + [0] * (PIECE_SLOTS - len(self.piece_lengths))
        return [int(self.problem is not None), self.documents, *pieces, *self.signature.encode()]


def _check_signatures(headers: Sequence[Sequence[int]]) -> None:
    """ValueError naming every signature field the ranks disagree on, with each rank's value."""
    decoded = [CallSignature.decode(h[2 + PIECE_SLOTS :]) for h in headers]
    differing = [name for name in decoded[0] if len({repr(d[name]) for d in decoded}) > 1]
    if differing:
        described = "; ".join(
            f"{name}: " + ", ".join(f"rank {r} {d[name]!r}" for r, d in enumerate(decoded))
            for name in differing
        )
        raise ValueError(
            f"the CP ranks called the layer differently ({described}): every rank of the group must pass the "
            "same mode, layout, config, dtype and options"
        )


def agree(local: LocalShard, rank: int, headers: Sequence[Sequence[int]]) -> ShardPlan:
    """The plan every rank derives from everyone's header; raises the same ValueError on every rank when the
    ranks' signatures differ, one rank's input failed its checks, the ranks hold different cu_seqlens, or
    the split does not fit the layout.

    headers[r] is rank r's `LocalShard.header()`.
    """
    failed = [r for r, h in enumerate(headers) if h[0]]
    if failed:
        if local.problem is not None:
            raise ValueError(local.problem)
        raise ValueError(
            f"CP rank(s) {failed} rejected their input (their error names the argument); every rank of the "
            "group stops here"
        )
    _check_signatures(headers)
    layout = local.signature.layout
    cp, per_rank = len(headers), pieces_per_rank(layout)
    prints = [h[1] for h in headers]
    if len(set(prints)) > 1:
        raise ValueError(
            "the CP ranks passed different cu_seqlens (fingerprints "
            f"{', '.join(f'rank {r}: {p:#010x}' for r, p in enumerate(prints))}): cu_seqlens holds the "
            "global document boundaries and must be the same tensor on every rank"
        )
    by_rank = [list(h[2 : 2 + per_rank]) for h in headers]
    shards = [sum(pieces) for pieces in by_rank]
    if min(shards) < 1:
        raise ValueError(
            f"CP ranks hold shards of {shards} tokens: every rank needs >= 1 token (use a smaller cp or a "
            "longer sequence)"
        )
    if layout == "zigzag":
        if len(set(shards)) > 1:
            raise ValueError(
                f"layout='zigzag' needs equal shards of T / cp tokens, but the ranks hold {shards}: shard "
                "the sequence with shard_sequence(x, group, layout='zigzag')"
            )
        check_zigzag_split(sum(shards), cp)
    lengths = [by_rank[owner].pop(0) for owner in piece_owners(layout, cp)]
    return ShardPlan(layout=layout, rank=rank, cp=cp, lengths=tuple(lengths))


def plan_documents(plan: ShardPlan, cu_seqlens: torch.Tensor | None) -> list[int] | None:
    """The checked global boundaries (after `agree`, so every rank checks the same values)."""
    bounds = None if cu_seqlens is None else document_bounds(cu_seqlens, plan.total)
    if mutants.ACTIVE is not None:  # a test's mutation of this rank's view (gdn_cp.distributed.mutants)
        bounds = mutants.document_bounds(bounds, plan)
    return bounds


def check_local_input(
    signature: CallSignature,
    shard_len: int,
    cu_seqlens: torch.Tensor | None,
    check: Callable[[list[int] | None], None] | None = None,
) -> LocalShard:
    """This rank's LocalShard: its piece lengths, its cu_seqlens' fingerprint, and the first problem of its
    own input (cu_seqlens malformed, a batch of more than one packed sequence, or what `check` raises, given
    the boundaries), caught rather than raised so that every rank can raise it together after the header.
    """
    problem, bounds = None, None
    try:
        if cu_seqlens is not None:
            check_packed_batch(signature.batch)
            # The total is checked after the header (only then is the global T known); the rest here.
            last = int(cu_seqlens[-1]) if len(cu_seqlens) else 0
            bounds = document_bounds(cu_seqlens, last)
        if check is not None:
            check(bounds)
    except ValueError as error:
        problem = str(error)
    # A rank whose cu_seqlens failed its checks sends the failure flag, which `agree` reads first.
    pieces = split_pieces(signature.layout, shard_len)
    return LocalShard(pieces, fingerprint(bounds), problem, signature)
