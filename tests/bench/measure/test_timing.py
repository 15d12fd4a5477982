"""Rank-max reduction and the summary statistics, on synthetic samples with known answers."""

from __future__ import annotations

import pytest

from bench.measure.timing import rank_max, summarize


def test_rank_max_takes_the_slowest_rank_per_repeat():
    assert rank_max([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]


def test_rank_max_refuses_ragged_or_empty_samples():
    with pytest.raises(ValueError, match="same number of repeats"):
        rank_max([[1.0, 2.0], [1.0]])
    with pytest.raises(ValueError, match="at least one"):
        rank_max([])


def test_summary_statistics_over_repeats_of_the_rank_max():
    # rank 1 is the straggler on repeats 0-3, rank 0 on repeat 4: rank-max = [2, 4, 6, 8, 10]
    samples = [[1.0, 2.0, 3.0, 4.0, 10.0], [2.0, 4.0, 6.0, 8.0, 5.0]]
    s = summarize(samples)
    assert s.median_s == 6.0 and s.min_s == 2.0 and s.max_s == 10.0 and s.mean_s == 6.0
    assert (s.q25_s, s.q75_s, s.iqr_s) == (4.0, 8.0, 4.0)  # linear interpolation
    assert s.rank_medians_s == [3.0, 5.0]
    assert s.rank_spread == pytest.approx(5.0 / 3.0)
    assert s.repeats == 5
    assert s.noisy  # IQR / median = 0.67


def test_noise_flag_threshold():
    quiet = summarize([[1.00, 1.01, 1.02, 1.03, 1.04]])
    assert not quiet.noisy and quiet.relative_iqr == pytest.approx(0.02 / 1.02)
    assert summarize([[1.0, 1.0, 1.1, 1.2, 1.2]]).noisy  # IQR 0.2 / median 1.1 > 10%
    assert not summarize([[1.0, 1.0, 1.1, 1.2, 1.2]], noise_threshold=0.5).noisy


def test_single_rank_single_repeat():
    s = summarize([[0.25]])
    assert (s.median_s, s.iqr_s, s.rank_spread, s.noisy) == (0.25, 0.0, 1.0, False)
