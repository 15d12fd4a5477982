"""The result files as series of the charts (Source, labelled branch@commit), and what every chart reads of
them: the CP degrees, lengths, passes and variants a scenario has, and a case's time with its bar."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.judge import analysis
from bench.judge.analysis import Variant, source_label
from bench.results.store import CaseResult, RunResult


@dataclass(frozen=True, slots=True)
class Source:
    """One result file as a series of the charts."""

    label: str
    """How the legend names it: branch@commit."""
    run: RunResult


def sources_for(runs: Sequence[RunResult]) -> list[Source]:
    """Label each run branch@commit; runs that would share a label get the run's name (its scenarios)
    appended, and a number after it where that is shared too: `main@6b5f0a48 (verify-cpu-verify, 2)`."""
    labels = [source_label(r) for r in runs]
    named = [f"{label} ({r.name}" for label, r in zip(labels, runs, strict=True)]
    out = []
    for i, (label, by_run, run) in enumerate(zip(labels, named, runs, strict=True)):
        if labels.count(label) == 1:
            out.append(Source(label=label, run=run))
        elif named.count(by_run) == 1:
            out.append(Source(label=f"{by_run})", run=run))
        else:
            out.append(Source(label=f"{by_run}, {named[: i + 1].count(by_run)})", run=run))
    return out


def union(sources: Sequence[Source], fn: Callable[[RunResult], list]) -> list:
    """The sorted union of `fn` over the sources' runs."""
    return sorted({x for s in sources for x in fn(s.run)})


def lengths_at(sources: Sequence[Source], scenario: str, cp: int) -> list[int]:
    """The global sequence lengths any source measured at CP degree `cp`."""
    return union(sources, lambda r: analysis.seq_lens(r, scenario, cp))


def passes(sources: Sequence[Source], scenario: str) -> list[str]:
    """The passes any source measured, in analysis.PASSES order."""
    present = {p for s in sources for p in analysis.passes(s.run, scenario)}
    return [p for p in analysis.PASSES if p in present]


def all_variants(sources: Sequence[Source], scenario: str) -> list[Variant]:
    """Every source's variants, in order of first appearance."""
    return list(dict.fromkeys(v for s in sources for v in analysis.variants(s.run, scenario)))


TIME_NOTE = (
    "time: the estimate, geometric mean of the round medians of the rank-max elapsed time; bars: its 95% "
    "interval across rounds (one round: the median over repeats, bars its IQR)"
)


def ms(result: CaseResult) -> tuple[float, float, float]:
    """The estimate, and the distances down and up to its 95% interval across rounds (with one round: the
    median over repeats and its IQR), in ms."""
    est = result.estimate
    if est is not None and est.low_s is not None and est.high_s is not None:
        return est.median_s * 1e3, (est.median_s - est.low_s) * 1e3, (est.high_s - est.median_s) * 1e3
    t = result.timing
    assert t is not None
    return t.median_s * 1e3, (t.median_s - t.q25_s) * 1e3, (t.q75_s - t.median_s) * 1e3
