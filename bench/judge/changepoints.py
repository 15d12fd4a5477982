"""Change points of a case's time across commits: binary segmentation, each split judged as `bench compare`
judges two refs. Pure.

A case's history is its round medians per run, in commit order (bench.judge.history). The method is
binary segmentation (Scott and Knott 1974; Vostrikova 1981), the search that E-divisive (Apache Otava) and
PELT (ruptures) refine: in a stretch of runs, every split into the runs before and the runs after is a
candidate; the one with the largest |t| of the Welch difference of the two parts' log round medians is the
best-supported place for a step. It is a change point when compare's verdict on after / before is worse or
better: the whole interval (bench.measure.statistics.ratio_interval) past the factor, at confidence
1 - alpha / candidates (Bonferroni over the splits looked at, so that looking at every split does not
inflate the false-verdict rate). The search then recurses into both parts, so several steps are found,
largest first.

Why this method: it accounts for each point's interval through the rounds the interval is made of (a run of
five consistent rounds weighs more than one of three scattered ones), and it pools the runs of each part, so
the drift between runs, which a single run's interval cannot see, is in the variance the step is judged
against: the same statistics that make an A/A compare give no verdict. asv's step fit needs a noise level
per point, which a run of three rounds does not give well; PELT's penalty has no false-alarm rate attached.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from bench.measure.statistics import RatioInterval, classify

Direction = Literal["worse", "better"]


@dataclass(frozen=True, slots=True)
class ChangePoint:
    """A step in a case's time: the runs from `index` on are at another level than those before."""

    index: int
    """The first run at the new level (an index into the history's runs)."""
    ratio: RatioInterval
    """after / before (the parts either side, within the stretch the step was found in) with its interval."""
    verdict: Direction
    """worse: a step up in time (a regression); better: a step down."""

    @property
    def effect(self) -> str:
        """slower or faster."""
        return "slower" if self.verdict == "worse" else "faster"


@dataclass(frozen=True, slots=True)
class _Run:
    """One run on a log scale: the mean of its log round medians and that mean's variance from its rounds."""

    mean: float
    var: float
    rounds: int


def _runs(runs: Sequence[Sequence[float]]) -> list[_Run]:
    logs = [np.log(np.asarray(r, dtype=float)) for r in runs]
    df = sum(x.size - 1 for x in logs)
    pooled = sum(float(((x - x.mean()) ** 2).sum()) for x in logs) / df if df > 0 else 0.0
    # a one-round run shows no variance of its own: the pooled within-run variance stands in
    return [
        _Run(float(x.mean()), (float(x.var(ddof=1)) if x.size > 1 else pooled) / x.size, x.size) for x in logs
    ]


def drift_variance(runs: Sequence[_Run]) -> float:
    """tau^2, the variance between runs beyond what their rounds show (run-to-run drift), from the
    differences of adjacent runs: E[d^2] = 2 tau^2 + v_i + v_{i+1}. Median-based, so that a step (one
    difference) does not inflate it; 0 with fewer than two runs."""
    if len(runs) < 2:
        return 0.0
    d = np.diff([r.mean for r in runs])
    spread = 1.4826 * float(np.median(np.abs(d - np.median(d))))
    return max(0.0, spread**2 / 2 - float(np.median([r.var for r in runs])))


@dataclass(frozen=True, slots=True)
class _Part:
    """The runs on one side of a split."""

    mean: float
    """Their mean, each run weighted by 1 / (tau^2 + its own variance) (a random-effects mean)."""
    var: float
    """Its variance."""
    df: float
    """Its degrees of freedom: the rounds' (sum of rounds - 1) when the drift is nothing beside the rounds'
    spread, tending to the runs' (runs - 1) as the drift dominates."""


def _part(runs: Sequence[_Run], tau2: float) -> _Part:
    w = np.array([1.0 / (tau2 + r.var) if tau2 + r.var > 0 else 0.0 for r in runs])
    within = float(np.mean([r.var for r in runs]))
    share = within / (tau2 + within) if tau2 + within > 0 else 1.0
    df = max(1.0, (len(runs) - 1) + share * (sum(r.rounds - 1 for r in runs) - (len(runs) - 1)))
    if w.sum() == 0:
        return _Part(float(np.mean([r.mean for r in runs])), 0.0, df)
    return _Part(float((w * [r.mean for r in runs]).sum() / w.sum()), float(1.0 / w.sum()), df)


def _interval(before: _Part, after: _Part, confidence: float) -> RatioInterval | None:
    """after / before with Welch's interval (Welch-Satterthwaite degrees of freedom)."""
    diff, var = after.mean - before.mean, before.var + after.var
    if var <= 0:
        return None
    df = var**2 / (before.var**2 / before.df + after.var**2 / after.df)
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(var)
    p = float(2 * stats.t.sf(abs(diff) / math.sqrt(var), df))
    counts = (round(before.df) + 1, round(after.df) + 1)
    return RatioInterval(math.exp(diff), math.exp(diff - half), math.exp(diff + half), p, counts)


def change_points(
    runs: Sequence[Sequence[float]], *, factor: float, alpha: float, min_runs: int = 1
) -> list[ChangePoint]:
    """The steps in a history of runs (each run its round medians in seconds, in commit order), by index
    (module docstring). `min_runs`: the fewest runs a part may have."""
    found: list[ChangePoint] = []
    logs = _runs(runs)
    tau2 = drift_variance(logs)

    def search(start: int, stop: int) -> None:
        tested = {
            k: (_part(logs[start:k], tau2), _part(logs[k:stop], tau2))
            for k in range(start + min_runs, stop - min_runs + 1)
        }
        tested = {k: parts for k, parts in tested.items() if parts[0].var + parts[1].var > 0}
        if not tested:
            return

        def t(k: int) -> float:
            before, after = tested[k]
            return abs(after.mean - before.mean) / math.sqrt(before.var + after.var)

        best = max(tested, key=t)
        interval = _interval(*tested[best], 1.0 - alpha / len(tested))
        verdict = None if interval is None else classify(interval, factor)
        if interval is None or verdict not in ("worse", "better"):
            return
        found.append(ChangePoint(index=best, ratio=interval, verdict=verdict))
        search(start, best)
        search(best, stop)

    search(0, len(runs))
    return sorted(found, key=lambda c: c.index)
