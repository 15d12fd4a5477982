"""Round-level statistics on synthetic timings: interval coverage, the false-verdict rate under drift, power
on known shifts, and what one round can and cannot say. Pure Python, seeded, fast."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.results.statistics import (
    classify,
    estimate,
    format_estimate,
    ratio_interval,
    smallest_detectable,
)

ALPHA = 0.05
FACTOR = 1.10
TRIALS = 2000


def rounds_of(rng: np.random.Generator, true_s: float, drift: np.ndarray, noise: float) -> np.ndarray:
    """Round medians [R]: the true time, times the machine's drift in that round, times the round's own
    noise (a process lifetime's luck: thread placement, allocator state), all multiplicative."""
    return true_s * np.exp(drift + rng.normal(0.0, noise, drift.size))


def interleaved(rng: np.random.Generator, ratio: float, rounds: int, drift_sd: float, noise: float):
    """Base and head measured round by round in turn: both rounds r see the same drift (a random walk, as a
    machine heating up or another job coming and going), each its own noise."""
    drift = np.cumsum(rng.normal(0.0, drift_sd, rounds))
    return rounds_of(rng, 0.010, drift, noise), rounds_of(rng, 0.010 * ratio, drift, noise)


@pytest.mark.parametrize("rounds", [3, 5])
def test_no_change_gets_a_verdict_at_most_alpha_of_the_time_under_drift(rounds: int):
    rng = np.random.default_rng(10 + rounds)
    verdicts = []
    covered = 0
    for _ in range(TRIALS):
        base, head = interleaved(rng, 1.0, rounds, drift_sd=0.05, noise=0.02)
        interval = ratio_interval(base, head, 1 - ALPHA)
        covered += interval.low <= 1.0 <= interval.high
        verdicts.append(classify(interval, FACTOR))
    false = sum(v in ("better", "worse") for v in verdicts) / TRIALS
    assert false <= ALPHA
    assert covered / TRIALS >= 1 - ALPHA - 0.01  # the interval itself holds its confidence, drift included


def test_a_known_slowdown_is_called_worse_and_a_speedup_better():
    rng = np.random.default_rng(7)
    for ratio, expected in ((1.4, "worse"), (1 / 1.4, "better")):
        calls = [
            classify(
                ratio_interval(*interleaved(rng, ratio, 3, drift_sd=0.02, noise=0.02), 1 - ALPHA), FACTOR
            )
            for _ in range(500)
        ]
        assert calls.count(expected) / len(calls) >= 0.9, (ratio, {v: calls.count(v) for v in set(calls)})
        assert calls.count("better" if expected == "worse" else "worse") == 0


def test_a_change_below_the_factor_is_never_a_verdict():
    rng = np.random.default_rng(3)
    calls = [
        classify(ratio_interval(*interleaved(rng, 1.05, 5, drift_sd=0.0, noise=0.005), 1 - ALPHA), FACTOR)
        for _ in range(300)
    ]
    assert set(calls) <= {"~", "too noisy"} and calls.count("~") > 250  # precise, but smaller than 10%


def test_the_estimate_interval_covers_the_true_time():
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(TRIALS):
        est = estimate(rounds_of(rng, 0.02, np.zeros(4), 0.05))
        hits += est.low_s <= 0.02 <= est.high_s
    assert abs(hits / TRIALS - 0.95) < 0.02  # exact for log-normal round medians


def test_repeats_inside_a_round_do_not_count_as_independent():
    """What the per-repeat test got wrong: 10 repeats per launch share the launch's offset, so pooling them
    says 'significant' for an A/A pair; round medians see one number per launch and stay quiet."""
    rng = np.random.default_rng(11)
    false = 0
    for _ in range(500):
        sides = []
        for _side in range(2):
            offsets = rng.normal(0.0, 0.05, 3)  # 3 launches, 5% apart
            repeats = np.exp(offsets[:, None] + rng.normal(0.0, 0.005, (3, 10)))  # tight repeats
            sides.append(np.median(repeats, axis=1))
        false += classify(ratio_interval(*sides, 1 - ALPHA), FACTOR) in ("better", "worse")
    assert false / 500 <= ALPHA


def test_too_noisy_says_what_the_data_could_detect():
    base, head = [0.010, 0.012, 0.009], [0.011, 0.009, 0.013]
    interval = ratio_interval(base, head)
    assert classify(interval, FACTOR) == "too noisy" and interval.high / interval.low > FACTOR
    detectable = smallest_detectable(interval, FACTOR)
    assert detectable > FACTOR
    # the same spread around that ratio would be called worse: its interval starts at the factor
    shifted = ratio_interval(base, [h * detectable / interval.ratio * 1.001 for h in head])
    assert classify(shifted, FACTOR) == "worse"


def test_one_round_has_no_interval():
    est = estimate([0.0123])
    assert est.median_s == pytest.approx(0.0123) and est.low_s is None and est.relative_half_width is None
    assert format_estimate(est) == "12.300 ms [1 round]"
    interval = ratio_interval([0.01], [0.02, 0.021])
    assert (
        interval.low is None and interval.p_value is None and math.isclose(interval.ratio, 2.0, rel_tol=0.03)
    )
    assert classify(interval, FACTOR) == "too noisy" and smallest_detectable(interval, FACTOR) is None


def test_the_estimate_is_the_geometric_mean_of_round_medians():
    est = estimate([0.01, 0.04])
    assert est.median_s == pytest.approx(0.02) and est.rounds == 2
    assert est.low_s < 0.02 < est.high_s and "geometric mean" in est.method
    assert format_estimate(est).startswith("20.000 ms [")
    with pytest.raises(ValueError, match="finite and > 0"):
        estimate([0.01, 0.0])
