"""A case followed across commits: the runs of many commits (bench.results.history loads them: a backfill,
or CI runs on main) grouped by machine and scenario, each case's runs in commit order with their change
points. Pure: records in, records out (no files).

    histories = build_histories(load_runs([Path("results/history")]).runs)
    for h in histories:  h.machine, h.scenario, h.commits, h.cases[i].runs, h.cases[i].changes

A run sits at its commit's date (GitInfo.date; older files: the date of the run), then when it ran, so that
several runs of one commit sit side by side. A machine is what makes times comparable: the CPU model, its
core count and the device (not the hostname, which a CI runner changes every time). A commit whose bench
could not run (bench.launch.backfill) is kept as failed, with its error.

Two adjacent runs of a case are judged by `bench compare`'s one rule (bench.judge.comparison.comparability):
where they are not comparable (another warmup, scenario definition, torch, threads, outputs), no change is
looked for across them (each comparable stretch is searched on its own) and the history says so
(`History.breaks`, `break_notes`), unless `force` (or `allow_different_outputs`, for the outputs alone), as in
`bench compare`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from bench.judge.changepoints import ChangePoint, change_points
from bench.judge.comparison import (
    DEFAULT_ALPHA,
    DEFAULT_FACTOR,
    clean_medians,
    comparability,
    not_comparable_note,
)
from bench.measure.memory import MEMORY_RESOLUTION_MIB
from bench.measure.statistics import format_ratio
from bench.results.history import Run
from bench.results.store import CaseResult, RunResult


@dataclass(frozen=True, slots=True)
class MemoryStep:
    """A change of a case's peak memory between two adjacent runs (deterministic: no interval)."""

    index: int
    before_mib: float
    after_mib: float


@dataclass(frozen=True, slots=True)
class Break:
    """Adjacent runs of some cases that are not comparable (bench.judge.comparison.comparability): no change
    is looked for across them."""

    index: int
    """The first run after the break (an index into the history's runs)."""
    reason: str
    """What differs, as `bench compare` names it."""
    keys: tuple[str, ...]
    """The cases it breaks."""


@dataclass(slots=True)
class CaseHistory:
    """One case's runs, in commit order (None where the case did not run ok in that run)."""

    key: str
    results: list[CaseResult | None]
    changes: list[ChangePoint] = field(default_factory=list)
    """Steps in its time, by index into `results` (bench.judge.changepoints)."""
    memory_steps: list[MemoryStep] = field(default_factory=list)

    def latest_change(self) -> int | None:
        """The index of its newest step in time, or None."""
        return max((c.index for c in self.changes), default=None)

    def contended(self, index: int) -> bool:
        """Whether its run at `index` was timed while the machine was shared (every round contended)."""
        result = self.results[index]
        return result is not None and result.contended

    def change_contended(self, change: ChangePoint) -> bool:
        """Either side of the step (the run before it, or its first run) was contended: the step may be the
        machine's, not the code's."""
        return any(self.contended(i) for i in (change.index - 1, change.index) if 0 <= i < len(self.results))


@dataclass(slots=True)
class History:
    """A scenario's runs on one machine."""

    machine: str
    scenario: str
    runs: list[Run]
    """In commit order (Run.order)."""
    cases: list[CaseHistory]
    breaks: list[Break] = field(default_factory=list)
    """Where adjacent runs are not comparable, by run then reason (empty with `force`)."""

    @property
    def newest(self) -> Run:
        return self.runs[-1]

    def contention_summary(self) -> str | None:
        """One line when some of its runs were timed on a shared machine, for every view of the history
        (the site, `bench history --format table`), or None: `3 of 12 runs contended (...)`."""
        shared = [i for i in range(len(self.runs)) if any(case.contended(i) for case in self.cases)]
        if not shared:
            return None
        commits = ", ".join(self.runs[i].commit.short for i in shared[:6]) + (
            " ..." if len(shared) > 6 else ""
        )
        return (
            f"{len(shared)} of {len(self.runs)} runs contended ({commits}): some case was timed while the "
            "machine was shared, so its time there is not the code's alone; a change next to such a run is "
            "marked (contended)"
        )


def break_notes(history: History) -> list[str]:
    """One line per break, as `bench compare` words it, with the commit it comes at: `not comparable at
    e761a03b (no change is looked for across it), 140 cases: different scenario cpu-scaling (warmup 3 vs 2);
    --force compares them anyway`."""
    return [
        not_comparable_note(
            b.reason,
            len(b.keys),
            where=f" at {history.runs[b.index].commit.short} (no change is looked for across it)",
        )
        for b in history.breaks
    ]


def change_text(change: ChangePoint, *, contended: bool = False) -> str:
    """`1.31x [1.22, 1.40] slower` / `... faster`, `(contended)` after it when a side was."""
    return f"{format_ratio(change.ratio)} {change.effect}" + (" (contended)" if contended else "")


def machine_of(run: RunResult) -> str:
    """What makes two runs' times comparable, as a label: `AMD EPYC 7B13, 2 cores, cpu`."""
    e = run.environment
    device = e.device_type if e.device_type == "cpu" else f"{e.device_type} {e.device_name}"
    return f"{e.cpu_model}, {e.cpu_count} cores, {device}"


def _memory_steps(results: Sequence[CaseResult | None]) -> list[MemoryStep]:
    """Adjacent ok runs whose peak differs by more than the memory resolution and 1%."""
    out = []
    known = [(i, r.memory.peak_mib) for i, r in enumerate(results) if r is not None and r.memory is not None]
    for (_, a), (j, b) in pairwise(known):
        if abs(b - a) > max(MEMORY_RESOLUTION_MIB, 0.01 * a):
            out.append(MemoryStep(j, a, b))
    return out


def build_histories(
    runs: Sequence[Run],
    *,
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
    force: bool = False,
    allow_different_outputs: bool = False,
) -> list[History]:
    """Every (machine, scenario) of `runs` (bench.results.history.load_runs), with each case's change
    points (`factor` and `alpha` as `bench compare` takes them), searched within the stretches of runs that
    are comparable (`force`, `allow_different_outputs`: as `bench compare` takes them); a scenario of
    verify records only, with no time to follow, has none."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        if r.run is not None:
            for scenario in r.run.scenarios:
                groups.setdefault((machine_of(r.run), scenario), []).append(r)
    for failed in runs:  # a failed commit has no machine of its own: it shows where its scenario is
        if failed.run is None:
            for (_, scenario), grouped in groups.items():
                if scenario in failed.scenarios:
                    grouped.append(failed)
    judge = _Judge(factor, alpha, force, allow_different_outputs)
    histories = [
        _history(machine, scenario, grouped, judge) for (machine, scenario), grouped in sorted(groups.items())
    ]
    return [h for h in histories if h.cases]


@dataclass(frozen=True, slots=True)
class _Judge:
    """How the histories are judged: `bench compare`'s thresholds and overrides."""

    factor: float
    alpha: float
    force: bool
    allow_different_outputs: bool


def _history(machine: str, scenario: str, runs: list[Run], judge: _Judge) -> History:
    runs = sorted(runs, key=lambda r: r.order)
    keys = list(
        dict.fromkeys(
            c.key for r in runs if r.run is not None for c in r.run.cases if c.case.scenario == scenario
        )
    )
    cases = []
    breaks: dict[tuple[int, str], list[str]] = {}
    for key in keys:
        results = []
        for r in runs:
            found = None if r.run is None else r.run.get(key)
            results.append(found if found is not None and found.status == "ok" and found.rounds else None)
        # the measured runs, in stretches of comparable neighbours: a step is looked for within each
        stretches: list[list[tuple[int, list[float]]]] = [[]]
        before: int | None = None
        for i, result in enumerate(results):
            if result is None:
                continue
            if before is not None and not judge.force:
                earlier = results[before]
                assert earlier is not None and runs[before].run is not None and runs[i].run is not None
                reason = comparability(
                    runs[before].run, earlier, runs[i].run, result, outputs=not judge.allow_different_outputs
                )
                if reason is not None:
                    breaks.setdefault((i, reason), []).append(key)
                    stretches.append([])
            stretches[-1].append((i, clean_medians(result)[0]))
            before = i
        changes = []
        for stretch in stretches:
            measured = [(i, m) for i, m in stretch if m]
            steps = change_points([m for _, m in measured], factor=judge.factor, alpha=judge.alpha)
            changes += [dataclasses.replace(c, index=measured[c.index][0]) for c in steps]
        cases.append(CaseHistory(key, results, changes, _memory_steps(results)))
    found = [Break(i, reason, tuple(k)) for (i, reason), k in sorted(breaks.items())]
    return History(machine, scenario, runs, cases, found)


def regressions_at_newest(histories: Sequence[History]) -> list[tuple[History, CaseHistory, ChangePoint]]:
    """The steps up in time that start at the newest commit of their history (what a CI job fails on)."""
    out = []
    for h in histories:
        newest = h.newest.commit.commit
        for case in h.cases:
            out += [
                (h, case, c)
                for c in case.changes
                if c.verdict == "worse" and h.runs[c.index].commit.commit == newest
            ]
    return out
