"""A case's samples as text (`bench hist`, after pyperf's `hist`): every timed pass of every rank, repeat
and round in one histogram, then each round on one axis, a digit per pass naming its rank, so that a
bimodal machine (two levels between lifetimes, one slow rank, a stalled pass) is seen, not averaged into an
estimate and its interval.

    tiny/p2p-ckpt-cp2-T64-fwd: 60 passes (3 rounds x 10 repeats x 2 ranks), 1.204 ms .. 3.410 ms
      1.204 ms .. 1.388 ms  ##########################  26
      ...
    each round on one axis, its passes as their rank's digit (* where two ranks share a column):
      r1  median 1.251 ms  |00 11 0                        |
      r2  median 3.104 ms  |                  0 1 1 00 11 |  contended

Bins are equal on a log scale when the slowest pass is over 3x the fastest (a stall would squash the rest
into one bin), else equal in time. Plain text: the lines fit the width they are given.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from bench.formats import format_seconds
from bench.results.store import CaseResult

LOG_SPAN = 3.0
"""Slowest / fastest pass above which bins are equal on a log scale."""
DEFAULT_BINS = 12


@dataclass(frozen=True, slots=True)
class Bin:
    low: float
    high: float
    count: int


def _edges(low: float, high: float, n: int) -> list[float]:
    """n + 1 bin edges from `low` to `high`: log-spaced when high / low > LOG_SPAN."""
    if high <= low:
        return [low, high]
    if high / low > LOG_SPAN:
        a, b = math.log(low), math.log(high)
        return [math.exp(a + (b - a) * i / n) for i in range(n + 1)]
    return [low + (high - low) * i / n for i in range(n + 1)]


def _position(value: float, edges: Sequence[float], columns: int) -> int:
    """The column (0 .. columns - 1) of `value` on the axis `edges` spans (log where the bins are)."""
    low, high = edges[0], edges[-1]
    if high <= low:
        return 0
    log = high / low > LOG_SPAN
    x = (math.log(value / low) / math.log(high / low)) if log else (value - low) / (high - low)
    return min(columns - 1, max(0, int(x * columns)))


def histogram(samples: Sequence[float], bins: int = DEFAULT_BINS) -> list[Bin]:
    """The samples in `bins` bins from the fastest to the slowest (one bin when all are equal)."""
    low, high = min(samples), max(samples)
    edges = _edges(low, high, bins)
    counts = [0] * (len(edges) - 1)
    for s in samples:
        counts[_position(s, edges, len(counts))] += 1
    return [Bin(edges[i], edges[i + 1], c) for i, c in enumerate(counts)]


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def case_histogram(result: CaseResult, width: int, bins: int = DEFAULT_BINS) -> list[str]:
    """A case's passes as lines of at most `width` characters: a header, the histogram, and a strip per
    round (see the module docstring); one line when the case has no timed pass."""
    rounds = result.rounds
    samples = [s for r in rounds for rank in r.samples_s for s in rank]
    if not samples:
        return [f"{result.key}: no timed pass ({result.status})"]
    ranks = max(len(r.samples_s) for r in rounds)
    repeats = max((len(rank) for r in rounds for rank in r.samples_s), default=0)
    low, high = min(samples), max(samples)
    scale = " (bins equal on a log scale)" if high / low > LOG_SPAN else ""
    header = (
        f"{result.key}: {len(samples)} passes ({_count(len(rounds), 'round')} x {_count(repeats, 'repeat')} "
        f"x {_count(ranks, 'rank')}), "
        f"{format_seconds(low)} .. {format_seconds(high)}{scale}"
    )
    lines = textwrap.wrap(header, width, subsequent_indent="  ", break_on_hyphens=False)
    found = histogram(samples, bins)
    labels = [f"{format_seconds(b.low)} .. {format_seconds(b.high)}" for b in found]
    label_width = max(len(s) for s in labels)
    count_width = len(str(max(b.count for b in found)))
    room = max(1, width - 2 - label_width - 2 - 2 - count_width)
    most = max(b.count for b in found)
    for label, b in zip(labels, found, strict=True):
        bar = "#" * (math.ceil(room * b.count / most) if b.count else 0)
        lines.append(f"  {label:>{label_width}}  {bar:<{room}}  {b.count:>{count_width}}")
    lines += textwrap.wrap(
        "each round on one axis, its passes as their rank's digit (* where two ranks share a column):",
        width,
        subsequent_indent="  ",
    )
    edges = [found[0].low, found[-1].high]
    heads = [f"r{i + 1}  median {format_seconds(r.median_s)}" for i, r in enumerate(rounds)]
    head_width = max(len(h) for h in heads)
    marks = ["  contended" if r.contended else "" for r in rounds]
    columns = max(8, width - 2 - head_width - 2 - 2 - max(len(m) for m in marks))
    for head, r, mark in zip(heads, rounds, marks, strict=True):
        strip = [" "] * columns
        for rank, passes in enumerate(r.samples_s):
            digit = str(rank % 10)
            for s in passes:
                at = _position(s, edges, columns)
                strip[at] = digit if strip[at] in (" ", digit) else "*"
        lines.append(f"  {head:<{head_width}}  |{''.join(strip)}|{mark}")
    return lines
