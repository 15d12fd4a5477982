"""Count the bytes each collective of gdn_cp.distributed sends and receives on this rank.

    with count_communication() as stats:
        loss = layer(x).sum(); loss.backward()
    stats.bytes_sent["all_to_all"], stats.bytes_received["p2p"], ...

Every collective in gdn_cp.distributed.collectives reports through `record`, so the counts are what went over
the wire from this rank's point of view (a rank's own share in an all-to-all or all-gather does not cross the
wire and is not counted). An all-reduce is counted as its buffer size each way; what the backend actually
moves depends on its algorithm (a ring moves 2 (n-1)/n of it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

CommKind = Literal["all_to_all", "halo", "all_gather", "p2p", "all_reduce"]
"""What a transfer is counted under: all_to_all (Ulysses), halo (the Conv1D halo and the shard lengths it
carries), all_gather (forward, and the exchange of its backward), p2p (send/recv), all_reduce. These name
collectives, not CP modes, although two of them share a mode's name."""
ALL_TO_ALL: CommKind = "all_to_all"
HALO: CommKind = "halo"
ALL_GATHER: CommKind = "all_gather"
P2P: CommKind = "p2p"
ALL_REDUCE: CommKind = "all_reduce"

Volume = dict[str, dict[str, int]]
"""kind -> {"sent": bytes, "received": bytes, "calls": n}, the layout of CommStats.as_dict()."""


def add_volume(volume: Volume, kind: CommKind, sent: int, received: int, calls: int = 1) -> None:
    """Add `calls` transfers of `kind` to a Volume (the communication model builds its volumes with it)."""
    v = volume.setdefault(kind, {"sent": 0, "received": 0, "calls": 0})
    v["sent"] += sent
    v["received"] += received
    v["calls"] += calls


@dataclass(slots=True)
class CommStats:
    """Bytes and calls per collective kind (CommKind)."""

    bytes_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes_received: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def as_dict(self) -> Volume:
        kinds = sorted(set(self.bytes_sent) | set(self.bytes_received) | set(self.calls))
        return {
            k: {"sent": self.bytes_sent[k], "received": self.bytes_received[k], "calls": self.calls[k]}
            for k in kinds
        }


_active: list[CommStats] = []


def record(kind: CommKind, sent: int, received: int) -> None:
    """Add one collective call of `kind` to every active counter."""
    for stats in _active:
        stats.bytes_sent[kind] += sent
        stats.bytes_received[kind] += received
        stats.calls[kind] += 1


@contextmanager
def count_communication() -> Iterator[CommStats]:
    """Count the collectives of gdn_cp.distributed run inside the block (forward and backward)."""
    stats = CommStats()
    _active.append(stats)
    try:
        yield stats
    finally:
        _active.remove(stats)
