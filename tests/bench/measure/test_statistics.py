"""Round-level statistics on synthetic timings: interval coverage, the false-verdict rate under drift, power
on known shifts, and what one round can and cannot say. Pure Python, seeded, fast."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.formats import format_estimate
from bench.measure.statistics import (
    RatioInterval,
    classify,
    estimate,
    paired_ratio_interval,
    ratio_interval,
    rounds_to_decide,
    smallest_detectable,
    turn_difference,
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
    assert format_estimate(est) == "12.300 ms (1 round)"
    interval = ratio_interval([0.01], [0.02, 0.021])
    assert (
        interval.low is None and interval.p_value is None and math.isclose(interval.ratio, 2.0, rel_tol=0.03)
    )
    assert classify(interval, FACTOR) == "too noisy" and smallest_detectable(interval, FACTOR) is None


def test_the_estimate_is_the_geometric_mean_of_round_medians():
    est = estimate([0.01, 0.04])
    assert est.median_s == pytest.approx(0.02) and est.rounds == 2
    assert est.low_s < 0.02 < est.high_s and "geometric mean" in est.method
    assert format_estimate(est).startswith("20.000 ms [")  # +-wider than 50%: its ends
    with pytest.raises(ValueError, match="finite and > 0"):
        estimate([0.01, 0.0])


def lifetimes(rng: np.random.Generator, ratio: float, rounds: int, shared: float, own: float):
    """Paired rounds: each lifetime r slows both sides alike by its shared offset (thread and memory
    placement, the clock: `shared`), and each side's layer by an offset of its own (`own`)."""
    offsets = rng.normal(0.0, shared, rounds)
    base = 0.010 * np.exp(offsets + rng.normal(0.0, own, rounds))
    head = 0.010 * ratio * np.exp(offsets + rng.normal(0.0, own, rounds))
    return list(zip(base, head, strict=True))


def differences(pairs) -> list[float]:
    """Each lifetime's log(head / base)."""
    return [math.log(h / b) for b, h in pairs]


@pytest.mark.parametrize("ratio", [1.0, 1.25])
def test_the_paired_interval_holds_its_confidence(ratio: float):
    """Lifetimes 13% apart (this VM's), the sides 2% apart inside one: the paired interval covers the true
    ratio 95% of the time; the shared part cancels, so it is several times narrower than Welch's on the same
    rounds, which must carry the lifetimes' differences."""
    rng = np.random.default_rng(21)
    covered, paired_widths, welch_widths = 0, [], []
    for _ in range(TRIALS):
        pairs = lifetimes(rng, ratio, 5, shared=0.13, own=0.02)
        interval = paired_ratio_interval(differences(pairs), 1 - ALPHA)
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
        paired.append(classify(paired_ratio_interval(differences(pairs), 1 - ALPHA), FACTOR))
        welch.append(classify(ratio_interval([b for b, _ in pairs], [h for _, h in pairs]), FACTOR))
    assert paired.count("worse") / 500 >= 0.95 and welch.count("worse") / 500 < 0.5


def test_paired_rounds_of_one_code_get_a_verdict_at_most_alpha_of_the_time():
    rng = np.random.default_rng(23)
    false = 0
    for _ in range(TRIALS):
        interval = paired_ratio_interval(
            differences(lifetimes(rng, 1.0, 5, shared=0.13, own=0.03)), 1 - ALPHA
        )
        false += classify(interval, 1.05) in ("better", "worse")
    assert false / TRIALS <= ALPHA / 2


def test_one_pair_has_no_interval_and_equal_pairs_are_exact():
    one = paired_ratio_interval([math.log(1.2)])
    assert one.low is None and one.p_value is None and one.paired and math.isclose(one.ratio, 1.2)
    exact = paired_ratio_interval([math.log(1.2)] * 2)  # the same ratio in both lifetimes
    assert math.isclose(exact.low, 1.2) and math.isclose(exact.high, 1.2) and exact.p_value < 1e-9
    with pytest.raises(ValueError, match="at least one"):
        paired_ratio_interval([])
    with pytest.raises(ValueError, match="finite"):
        paired_ratio_interval([0.1, math.inf])


def test_a_lifetimes_difference_is_the_hodges_lehmann_estimate_of_its_turns():
    # log ratios 0, 0, log 4: the Walsh means are 0, 0, 0, log 2, log 2, log 4; their median is log(2) / 2
    assert turn_difference([1.0, 2.0, 3.0], [1.0, 2.0, 12.0]) == pytest.approx(math.log(2) / 2)
    # the same ratio in every turn is that ratio, whatever the turns' own times
    assert turn_difference([0.010, 0.030, 0.020], [0.012, 0.036, 0.024]) == pytest.approx(math.log(1.2))
    with pytest.raises(ValueError, match="come in pairs"):
        turn_difference([0.01, 0.02], [0.01])


def turns(
    rng: np.random.Generator, ratio: float, n: int, lifetime_sd: float, moment_sd: float, own_sd: float
):
    """One paired lifetime's passes, base and head in turn [n] seconds each: the lifetime's offset shared by
    all, each turn's moment shared by its two passes, and each pass's own noise."""
    shared = rng.normal(0.0, lifetime_sd) + rng.normal(0.0, moment_sd, n)
    base = 0.010 * np.exp(shared + rng.normal(0.0, own_sd, n))
    head = 0.010 * ratio * np.exp(shared + rng.normal(0.0, own_sd, n))
    return base, head


def test_turns_estimate_a_lifetimes_ratio_better_than_its_two_medians():
    """Passes of one lifetime vary (moments 8% apart, each pass 4% of its own): the turns' difference varies
    less between lifetimes than the difference of the two round medians, and one stalled pass (10x) moves
    it little, where it would drag a mean of the turns."""
    rng = np.random.default_rng(24)
    by_turns, by_medians = [], []
    for _ in range(TRIALS):
        base, head = turns(rng, 1.1, 3, lifetime_sd=0.13, moment_sd=0.08, own_sd=0.04)
        by_turns.append(turn_difference(base, head))
        by_medians.append(math.log(np.median(head) / np.median(base)))
    assert np.mean(by_turns) == pytest.approx(math.log(1.1), abs=0.005)
    assert np.std(by_turns) < 0.8 * np.std(by_medians)
    base, head = turns(rng, 1.1, 20, lifetime_sd=0.13, moment_sd=0.0, own_sd=0.01)
    head[7] *= 10
    assert turn_difference(base, head) == pytest.approx(math.log(1.1), abs=0.02)


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


def test_the_rounds_a_case_needs_are_projected_from_its_spread_and_its_distance_to_a_boundary():
    # 1.10 +-6% at 10 rounds against factor 1.05: a round's sd 8.1%, 0.047 from the boundary: ~12 rounds
    at_ten = RatioInterval(1.10, 1.10 / 1.06, 1.10 * 1.06, 0.01, (10, 10))
    assert rounds_to_decide(at_ten, 1.05, ALPHA) == pytest.approx(11.7, abs=0.3)
    wider = RatioInterval(1.10, 1.10 / 1.12, 1.10 * 1.12, 0.01, (10, 10))
    closer = RatioInterval(1.07, 1.07 / 1.06, 1.07 * 1.06, 0.01, (10, 10))
    assert rounds_to_decide(wider, 1.05, ALPHA) > 3 * rounds_to_decide(at_ten, 1.05, ALPHA)
    assert rounds_to_decide(closer, 1.05, ALPHA) > 3 * rounds_to_decide(at_ten, 1.05, ALPHA)
    # an unchanged head heads for ~ at the same pace as a changed one for worse
    same = RatioInterval(1.0, 1 / 1.06, 1.06, 0.9, (10, 10))
    assert rounds_to_decide(same, 1.05, ALPHA) < rounds_to_decide(at_ten, 1.05, ALPHA)
    on_boundary = RatioInterval(1.05, 1.05 / 1.06, 1.05 * 1.06, 0.1, (10, 10))
    assert rounds_to_decide(on_boundary, 1.05, ALPHA) == math.inf
    assert rounds_to_decide(RatioInterval(1.1, None, None, None, (1, 1)), 1.05, ALPHA) == math.inf


def test_projected_rounds_are_about_those_a_verdict_needs():
    """A head 1.10x slower whose lifetimes' differences are 15% apart needs (z sd / margin)^2 = 40 rounds at
    alpha 0.05: projected from 10 rounds, the median projection is within 25% of that. One projection is
    rough (the margin is estimated too), but it orders cases: a head 1.25x slower projects fewer rounds than
    one 1.07x slower in 9 of 10 trials, which is what the budget's spending needs."""
    rng = np.random.default_rng(25)
    needed = (1.96 * 0.15 / math.log(1.1 / 1.05)) ** 2

    def projected(ratio: float) -> float:
        differences = rng.normal(math.log(ratio), 0.15, 10)
        return rounds_to_decide(paired_ratio_interval(differences, 1 - ALPHA), 1.05, ALPHA)

    assert 0.75 * needed <= np.median([projected(1.1) for _ in range(TRIALS)]) <= 1.25 * needed
    assert np.mean([projected(1.25) < projected(1.07) for _ in range(TRIALS)]) >= 0.9
