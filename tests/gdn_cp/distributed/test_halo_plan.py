"""Who sends which piece's tail in the halo exchange: a pure rule of (owners, width), checked without ranks
(gdn_cp.distributed.collectives.wants_tail; halo_tails counts it for the communication model)."""

from __future__ import annotations

import pytest

from gdn_cp.distributed.collectives import wants_tail
from gdn_cp.distributed.layout import piece_owners
from gdn_cp.distributed.modes.sequence_shard import halo_tails


def _plan(owners: tuple[int, ...], width: int) -> set[tuple[int, int]]:
    """(piece, peer) pairs: peer gets piece's tail."""
    cp = max(owners) + 1
    return {(j, peer) for j in range(len(owners)) for peer in range(cp) if wants_tail(owners, width, peer, j)}


def test_contiguous_shards_send_each_tail_to_the_next_ranks_within_the_width() -> None:
    owners = piece_owners("contiguous", 4)
    assert _plan(owners, 1) == {(0, 1), (1, 2), (2, 3)}
    # a halo of 3 tokens may span three earlier shards of one token each
    assert _plan(owners, 3) == {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}


def test_zigzag_never_sends_a_rank_its_own_tail() -> None:
    owners = piece_owners("zigzag", 2)  # pieces 0..3 held by ranks 0, 1, 1, 0
    assert owners == (0, 1, 1, 0)
    assert _plan(owners, 1) == {(0, 1), (2, 0)}  # piece 1 -> 2 stays on rank 1
    assert _plan(owners, 2) == {(0, 1), (1, 0), (2, 0)}


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [2, 3, 4, 8])
@pytest.mark.parametrize("width", [1, 3])
def test_every_tail_sent_is_received_once(layout: str, cp: int, width: int) -> None:
    """The counts the communication model uses: what all ranks send equals what all receive, and the last
    piece's tail goes nowhere."""
    owners = piece_owners(layout, cp)
    sent, received = zip(*(halo_tails(owners, rank, width) for rank in range(cp)), strict=True)
    assert sum(sent) == sum(received) == len(_plan(owners, width))
    assert not any(j == len(owners) - 1 for j, _ in _plan(owners, width))
