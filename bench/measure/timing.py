"""Reduce per-rank, per-repeat elapsed times to what a case reports. Pure functions.

A step of a CP layer is only as fast as its slowest rank, so each repeat counts as the maximum over ranks
(rank-max); the summary statistics are over repeats of that. The per-rank medians show stragglers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NOISE_THRESHOLD = 0.10
"""A case is flagged noisy when IQR / median over repeats exceeds this."""


@dataclass(kw_only=True, slots=True)
class TimingSummary:
    """Statistics over repeats of the rank-max elapsed time, in seconds."""

    median_s: float
    """Median over repeats: the reported time."""
    min_s: float
    max_s: float
    mean_s: float
    q25_s: float
    """25th percentile (linear interpolation)."""
    q75_s: float
    """75th percentile."""
    iqr_s: float
    """q75 - q25."""
    noisy: bool
    """IQR / median > NOISE_THRESHOLD: rerun on a quieter machine or with more repeats."""
    rank_medians_s: list[float]
    """Median over repeats of each rank's own elapsed time, by rank."""
    rank_spread: float
    """max / min of rank_medians_s (1.0: balanced ranks)."""
    repeats: int
    """Number of repeats."""

    @property
    def relative_iqr(self) -> float:
        return self.iqr_s / self.median_s if self.median_s > 0 else 0.0


def rank_max(samples: Sequence[Sequence[float]]) -> list[float]:
    """[rank][repeat] -> [repeat]: the slowest rank of each repeat."""
    if not samples or not samples[0]:
        raise ValueError("rank_max needs at least one rank and one repeat")
    lengths = {len(s) for s in samples}
    if len(lengths) != 1:
        raise ValueError(f"every rank must have the same number of repeats, got {sorted(lengths)}")
    return np.max(np.asarray(samples, dtype=float), axis=0).tolist()


def summarize(samples: Sequence[Sequence[float]], noise_threshold: float = NOISE_THRESHOLD) -> TimingSummary:
    """Summary of [rank][repeat] elapsed seconds (see TimingSummary)."""
    per_repeat = np.asarray(rank_max(samples))
    q25, median, q75 = np.percentile(per_repeat, [25, 50, 75]).tolist()
    rank_medians = [float(np.median(s)) for s in samples]
    iqr = q75 - q25
    return TimingSummary(
        median_s=median,
        min_s=float(per_repeat.min()),
        max_s=float(per_repeat.max()),
        mean_s=float(per_repeat.mean()),
        q25_s=q25,
        q75_s=q75,
        iqr_s=iqr,
        noisy=median > 0 and iqr / median > noise_threshold,
        rank_medians_s=rank_medians,
        rank_spread=max(rank_medians) / max(min(rank_medians), 1e-12),  # finite: results are JSON
        repeats=len(per_repeat),
    )
