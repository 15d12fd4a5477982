"""Round-level statistics on synthetic timings: interval coverage, the false-verdict rate under drift, power
on known shifts, and what one round can and cannot say. Pure Python, seeded, fast."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.results.statistics import (
    RatioInterval,
    classify,
    estimate,
    format_estimate,
    paired_ratio_interval,
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


def lifetimes(rng: np.random.Generator, ratio: float, rounds: int, shared: float, own: float):
    """Paired rounds: each lifetime r slows both sides alike by its shared offset (thread and memory
    placement, the clock: `shared`), and each side's layer by an offset of its own (`own`)."""
    offsets = rng.normal(0.0, shared, rounds)
    base = 0.010 * np.exp(offsets + rng.normal(0.0, own, rounds))
    head = 0.010 * ratio * np.exp(offsets + rng.normal(0.0, own, rounds))
    return list(zip(base, head, strict=True))


@pytest.mark.parametrize("ratio", [1.0, 1.25])
def test_the_paired_interval_holds_its_confidence(ratio: float):
    """Lifetimes 13% apart (this VM's), the sides 2% apart inside one: the paired interval covers the true
    ratio 95% of the time; the shared part cancels, so it is several times narrower than Welch's on the same
    rounds, which must carry the lifetimes' differences."""
    rng = np.random.default_rng(21)
    covered, paired_widths, welch_widths = 0, [], []
    for _ in range(TRIALS):
        pairs = lifetimes(rng, ratio, 5, shared=0.13, own=0.02)
        interval = paired_ratio_interval(pairs, 1 - ALPHA)
        covered += interval.low <= ratio <= interval.high
        paired_widths.append(interval.half_width)
        welch = ratio_interval([b for b, _ in pairs], [h for _, h in pairs], 1 - ALPHA)
        welch_widths.append(welch.half_width)
    assert abs(covered / TRIALS - (1 - ALPHA)) < 0.015
    assert np.log(np.median(welch_widths)) > 4 * np.log(np.median(paired_widths))


def test_paired_rounds_call_a_quarter_slower_head_where_welch_cannot():
    rng = np.random.default_rng(22)
    paired, welch = [], []
    for _ in range(500):
        pairs = lifetimes(rng, 1.25, 5, shared=0.13, own=0.02)
        paired.append(classify(paired_ratio_interval(pairs, 1 - ALPHA), FACTOR))
        welch.append(classify(ratio_interval([b for b, _ in pairs], [h for _, h in pairs]), FACTOR))
    assert paired.count("worse") / 500 >= 0.95 and welch.count("worse") / 500 < 0.5


def test_paired_rounds_of_one_code_get_a_verdict_at_most_alpha_of_the_time():
    rng = np.random.default_rng(23)
    false = 0
    for _ in range(TRIALS):
        interval = paired_ratio_interval(lifetimes(rng, 1.0, 5, shared=0.13, own=0.03), 1 - ALPHA)
        false += classify(interval, 1.05) in ("better", "worse")
    assert false / TRIALS <= ALPHA / 2


def test_one_pair_has_no_interval_and_equal_pairs_are_exact():
    one = paired_ratio_interval([(0.010, 0.012)])
    assert one.low is None and one.p_value is None and one.paired and math.isclose(one.ratio, 1.2)
    exact = paired_ratio_interval([(0.010, 0.012), (0.020, 0.024)])  # the same ratio in both lifetimes
    assert math.isclose(exact.low, 1.2) and math.isclose(exact.high, 1.2) and exact.p_value < 1e-9


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [
        (1.12, 1.30, "worse"),
        (0.70, 0.90, "better"),
        (0.95, 1.05, "~"),  # no change of 10% either way
        (1.02, 1.15, "too noisy"),  # could be a change of 10%, could be less
        (0.85, 1.20, "too noisy"),
    ],
)
def test_verdicts_by_where_the_interval_lies(low: float, high: float, verdict: str):
    interval = RatioInterval(math.sqrt(low * high), low, high, 0.5, (5, 5))
    assert classify(interval, FACTOR) == verdict
