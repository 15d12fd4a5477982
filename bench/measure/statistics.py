"""Round-level statistics: a case's time with a confidence interval, and the head/base ratio's. Pure.

Why rounds and not repeats: the repeats of one round run back to back in one process lifetime and share its
state (allocator, caches, thread placement, what else the machine was doing), so they are correlated; the
variance that decides whether a change is real is between process lifetimes and over time. Each round is
one pool lifetime (bench.launch.pool), so each round contributes one number: its median over repeats of
the rank-max time (the round median). Everything here starts from round medians, in seconds.

Method (analytic, Student t on logarithms; not scipy.stats.bootstrap): timing noise is multiplicative, so
round medians are taken on a log scale, where a ratio is a difference. With R = 3-5 rounds a bootstrap is
not usable: 3 values have 10 distinct resampled means and its interval is too narrow (it undercovers by
design at n < 10), and the order-statistic interval of a median cannot reach 95% below 6 values
(1 - 2 / 2^5 = 94%). The t interval is exact for normal log round medians (a round median is a median of
repeats: close to normal) and widens honestly at small R (t_{0.975, 2} = 4.30).

- The estimate of a case: the geometric mean of its round medians, exp(mean(log m_r)), with the t interval
  exp(mean +- t_{1-a/2, R-1} * sd / sqrt(R)). One round: no interval (no between-round variance seen).
- The ratio head/base: exp(mean(log h) - mean(log b)) with Welch's interval (unequal variances,
  Welch-Satterthwaite degrees of freedom). Rounds of both sides interleaved in one session (`bench compare
  REF REF`) see the same drift spread over both sides, which inflates both variances alike: the interval
  stays valid (conservative). Two files measured at different times do not: drift between them is not in
  either variance.
- Paired rounds (a paired `bench compare REF REF`: both refs' layers timed in one lifetime of the ranks,
  pass by pass in turn): each lifetime gives one difference d_r of log times, in which what the lifetime
  shares cancels; the ratio is exp(mean d_r) with the one-sample t interval over the R lifetimes (R - 1
  degrees of freedom). The lifetimes are independent, so it is as valid as Welch's, and narrower by as much
  as the lifetimes differ from each other. d_r is not the difference of the two round medians but
  `turn_difference`: pass i of base and pass i of head ran back to back, so each turn's log ratio
  log(h_i / b_i) cancels what the moment shares too, and their Hodges-Lehmann estimate (the median of the
  pairwise means) keeps 95% of a mean's efficiency (a median of 3 keeps 74%) while one stalled pass moves
  it little. Measured on a 2-core AMD VM (38 cases, 10 lifetimes, 3 turns each): the sd of d_r fell from
  8.3% to 6.8% (median case), the interval's half-width with it. So a paired ratio is close to, but not
  exactly, the ratio of the two sides' estimates.
- Verdict against a factor f > 1, the smallest change that matters: "worse" when the whole interval lies
  at or above f, "better" when at or below 1/f, "~" when it lies within [1/f, f] (no change of f either
  way); otherwise "too noisy": the interval reaches past f or 1/f without lying past it, so the data cannot
  tell a change of f from a smaller one (more rounds would). Under no change a verdict needs the interval
  to miss 1 by a factor f, so the false-verdict rate is below alpha / 2 per side. The smallest ratio the
  data could call worse is f * half-width (its interval has the same width): every compare reports it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
"""Default confidence of every interval (alpha = 0.05)."""
METHOD = "geometric mean of round medians, Student t interval on their logarithms"
"""What Estimate.median_s is and how its interval is made (stored with each estimate)."""

RatioVerdict = Literal["better", "worse", "~", "too noisy"]


@dataclass(kw_only=True, slots=True)
class Estimate:
    """A case's time from its rounds, in seconds."""

    median_s: float
    """The estimate: geometric mean of the round medians (each the median over repeats of the rank-max)."""
    low_s: float | None
    """Lower end of the confidence interval; None with one round."""
    high_s: float | None
    """Upper end; None with one round."""
    rounds: int
    """Round medians it is made of."""
    confidence: float = CONFIDENCE
    """Coverage of the interval (0.95)."""
    method: str = METHOD
    """How it was computed."""

    @property
    def relative_half_width(self) -> float | None:
        """sqrt(high / low) - 1: the interval's half-width as a fraction (0.04: +-4%); None with one round."""
        if self.low_s is None or self.high_s is None or self.low_s <= 0:
            return None
        return math.sqrt(self.high_s / self.low_s) - 1.0


def _logs(values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("need a non-empty list of round medians")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"round medians must be finite and > 0 seconds, got {list(values)}")
    return np.log(arr)


def estimate(round_medians: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """The estimate and t interval of a case from its round medians [R] in seconds (module docstring)."""
    logs = _logs(round_medians)
    n = logs.size
    centre = float(logs.mean())
    if n < 2:
        return Estimate(median_s=math.exp(centre), low_s=None, high_s=None, rounds=n, confidence=confidence)
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * float(logs.std(ddof=1)) / math.sqrt(n)
    return Estimate(
        median_s=math.exp(centre),
        low_s=math.exp(centre - half),
        high_s=math.exp(centre + half),
        rounds=n,
        confidence=confidence,
    )


@dataclass(frozen=True, slots=True)
class RatioInterval:
    """head / base of the two estimates, with its confidence interval (None where a side has one round)."""

    ratio: float
    low: float | None
    high: float | None
    p_value: float | None
    """Two-sided Welch t test on the log round medians (no change: log ratio 0); None with one round."""
    rounds: tuple[int, int]
    """Round medians used, (base, head)."""
    paired: bool = False
    """From paired rounds (paired_ratio_interval), else Welch's over two sides' rounds (ratio_interval)."""

    @property
    def half_width(self) -> float | None:
        """sqrt(high / low): the interval's half-width as a factor (1.05: +-5%)."""
        if self.low is None or self.high is None:
            return None
        return math.sqrt(self.high / self.low)


def _t_ratio(
    diff: float, se: float, df: float, rounds: tuple[int, int], confidence: float, *, paired: bool
) -> RatioInterval:
    """exp(diff) with the t interval of its standard error `se` at `df` degrees of freedom (a difference of
    log times), and the two-sided p-value of no change; se 0: the difference is exact."""
    if se == 0.0:
        p = 1.0 if diff == 0.0 else 0.0
        return RatioInterval(math.exp(diff), math.exp(diff), math.exp(diff), p, rounds, paired=paired)
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    p = float(2 * stats.t.sf(abs(diff) / se, df))
    return RatioInterval(
        math.exp(diff), math.exp(diff - half), math.exp(diff + half), p, rounds, paired=paired
    )


def ratio_interval(
    base_medians: Sequence[float], head_medians: Sequence[float], confidence: float = CONFIDENCE
) -> RatioInterval:
    """head/base from round medians in seconds ([R_base], [R_head]): Welch's interval on the logs."""
    b, h = _logs(base_medians), _logs(head_medians)
    diff = float(h.mean() - b.mean())
    if b.size < 2 or h.size < 2:
        return RatioInterval(math.exp(diff), None, None, None, (b.size, h.size))
    vb, vh = float(b.var(ddof=1)) / b.size, float(h.var(ddof=1)) / h.size
    se = math.sqrt(vb + vh)  # 0: identical rounds on each side
    df = (vb + vh) ** 2 / (vb**2 / (b.size - 1) + vh**2 / (h.size - 1)) if se else 1.0  # Welch-Satterthwaite
    return _t_ratio(diff, se, df, (b.size, h.size), confidence, paired=False)


def turn_difference(base_passes: Sequence[float], head_passes: Sequence[float]) -> float:
    """One paired lifetime's log(head / base) from its passes timed in turn, [repeat] seconds a side, pass i
    of both sides run back to back: the Hodges-Lehmann estimate of the turns' log ratios, the median of
    their pairwise (Walsh) means (module docstring)."""
    if len(base_passes) != len(head_passes):
        raise ValueError(
            f"passes timed in turn come in pairs, got {len(base_passes)} base and {len(head_passes)} head"
        )
    d = _logs(head_passes) - _logs(base_passes)
    i, j = np.triu_indices(d.size)
    return float(np.median((d[i] + d[j]) / 2))


def paired_ratio_interval(differences: Sequence[float], confidence: float = CONFIDENCE) -> RatioInterval:
    """head/base from lifetimes measured in pairs, [R] differences of log times (log(head / base), one per
    lifetime: `turn_difference`): the one-sample t interval of their mean (module docstring)."""
    if not len(differences):
        raise ValueError("need at least one paired lifetime")
    d = np.asarray(differences, dtype=float)
    if d.ndim != 1 or not np.all(np.isfinite(d)):
        raise ValueError(f"differences of log times must be finite, got {list(differences)}")
    n, diff = d.size, float(d.mean())
    if n < 2:
        return RatioInterval(math.exp(diff), None, None, None, (n, n), paired=True)
    se = float(d.std(ddof=1)) / math.sqrt(n)  # 0: the same difference in every lifetime
    return _t_ratio(diff, se, n - 1, (n, n), confidence, paired=True)


def classify(interval: RatioInterval, factor: float) -> RatioVerdict:
    """better / worse when the whole interval lies past the factor; ~ when it lies within [1/factor,
    factor]; else (or without an interval) too noisy (module docstring)."""
    if interval.low is None or interval.high is None:
        return "too noisy"
    if interval.low >= factor:
        return "worse"
    if interval.high <= 1.0 / factor:
        return "better"
    if interval.low >= 1.0 / factor and interval.high <= factor:
        return "~"
    return "too noisy"


def smallest_detectable(interval: RatioInterval, factor: float) -> float | None:
    """The smallest head/base this data could call worse: factor x the interval's half-width (an interval
    as wide, centred there, starts at the factor); its inverse is the largest it could call better."""
    width = interval.half_width
    return None if width is None else factor * width


def rounds_to_decide(interval: RatioInterval, factor: float, alpha: float) -> float:
    """About how many rounds in all `interval`'s case needs for a verdict against `factor` at `alpha`, if
    its estimate and its rounds' spread hold: its interval must clear the boundary nearest its estimate
    (lie past the factor for worse / better, within it for ~), and its half-width shrinks as 1 / sqrt(R).
    math.inf for an estimate on a boundary or no interval; a projection to spend rounds on, not a test."""
    rounds = min(interval.rounds)
    if interval.low is None or interval.high is None or rounds < 2:
        return math.inf
    margin = abs(abs(math.log(interval.ratio)) - math.log(factor))
    half = math.log(interval.high / interval.low) / 2
    if half == 0.0:
        return float(rounds)
    if margin == 0.0:
        return math.inf
    sd = half * math.sqrt(rounds) / float(stats.t.ppf(1 - alpha / 2, rounds - 1))  # a round's spread
    return (float(stats.norm.ppf(1 - alpha / 2)) * sd / margin) ** 2


def format_ratio(interval: RatioInterval) -> str:
    """`1.03x [0.98, 1.09]`: the ratio and its 95% interval; `1.03x` without one."""
    if interval.low is None or interval.high is None:
        return f"{interval.ratio:.2f}x"
    return f"{interval.ratio:.2f}x [{interval.low:.2f}, {interval.high:.2f}]"
