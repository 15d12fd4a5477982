"""A case followed across commits: result files of many commits (a backfill, or CI runs on main), grouped by
machine and scenario, each case's runs in commit order with their change points.

    histories = load_history([Path("results/history")])     # files and folders, searched for *.json
    for h in histories:  h.machine, h.scenario, h.commits, h.cases[i].runs, h.cases[i].changes

A run is one result file; its place is its commit's date (GitInfo.date; older files: the date of the run),
then when it ran, so that several runs of one commit sit side by side. A machine is what makes times
comparable: the CPU model, its core count and the device (not the hostname, which a CI runner changes every
time). A commit whose bench could not run (bench.launch.backfill) is kept as failed, with its error.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from bench.errors import UserError
from bench.judge.changepoints import ChangePoint, change_points
from bench.judge.comparison import DEFAULT_ALPHA, DEFAULT_FACTOR, clean_medians
from bench.measure.memory import MEMORY_RESOLUTION_MIB
from bench.measure.statistics import format_ratio
from bench.results.env import commit_metadata
from bench.results.store import CaseResult, RunResult, load_result

FAILED_SUFFIX = ".failed.json"
"""A backfill's record of a commit whose bench could not run: {commit, date, subject, error}."""


@dataclass(frozen=True, slots=True)
class Commit:
    commit: str
    date: str | None
    """Committer date, ISO 8601 (None: unknown; the run's own date orders it)."""
    subject: str | None

    @property
    def short(self) -> str:
        return self.commit[:8]


@dataclass(frozen=True, slots=True)
class Run:
    """One result file of a scenario on a machine."""

    commit: Commit
    created_at: str
    path: Path
    run: RunResult | None
    """None: the commit's bench could not run (`error`)."""
    error: str | None = None

    @property
    def date(self) -> str:
        """The commit's date, else the run's (ISO 8601)."""
        return self.commit.date or self.created_at

    @property
    def order(self) -> tuple[str, str]:
        return (self.date, self.created_at)


@dataclass(frozen=True, slots=True)
class MemoryStep:
    """A change of a case's peak memory between two adjacent runs (deterministic: no interval)."""

    index: int
    before_mib: float
    after_mib: float


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


def change_text(change: ChangePoint, *, contended: bool = False) -> str:
    """`1.31x [1.22, 1.40] slower` / `... faster`, `(contended)` after it when a side was."""
    return f"{format_ratio(change.ratio)} {change.effect}" + (" (contended)" if contended else "")


def machine_of(run: RunResult) -> str:
    """What makes two runs' times comparable, as a label: `AMD EPYC 7B13, 2 cores, cpu`."""
    e = run.environment
    device = e.device_type if e.device_type == "cpu" else f"{e.device_type} {e.device_name}"
    return f"{e.cpu_model}, {e.cpu_count} cores, {device}"


def _files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out += sorted(p for p in path.rglob("*.json") if not p.name.startswith("."))
        elif path.is_file():
            out.append(path)
        else:
            raise UserError(
                f"{path}: no such file or folder; give result files or the folders that hold them"
            )
    return out


def _failed(path: Path) -> tuple[str, Run]:
    """A backfill's failure record as a run of its scenario (`name` in the record)."""
    try:
        data = json.loads(path.read_text())
        commit = Commit(data["commit"], data.get("date"), data.get("subject"))
        return data["name"], Run(commit, data["created_at"], path, None, data["error"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path}: not a backfill failure record ({exc}); remove it or re-run the backfill"
        ) from None


def _memory_steps(results: Sequence[CaseResult | None]) -> list[MemoryStep]:
    """Adjacent ok runs whose peak differs by more than the memory resolution and 1%."""
    out = []
    known = [(i, r.memory.peak_mib) for i, r in enumerate(results) if r is not None and r.memory is not None]
    for (_, a), (j, b) in pairwise(known):
        if abs(b - a) > max(MEMORY_RESOLUTION_MIB, 0.01 * a):
            out.append(MemoryStep(j, a, b))
    return out


def load_history(
    paths: Sequence[Path], *, factor: float = DEFAULT_FACTOR, alpha: float = DEFAULT_ALPHA
) -> list[History]:
    """Every (machine, scenario) of the result files under `paths`, with each case's change points
    (`factor` and `alpha` as `bench compare` takes them). UserError when no result file is found."""
    groups: dict[tuple[str, str], list[Run]] = {}
    failures: list[tuple[str, Run]] = []
    for path in _files(paths):
        if path.name.endswith(FAILED_SUFFIX):
            failures.append(_failed(path))
            continue
        run = load_result(path)
        e = run.environment
        date, subject = e.git_date, e.git_subject
        if date is None:  # a file from before the environment recorded it: ask the checkout, if it knows
            date, subject = commit_metadata(Path.cwd(), e.git_commit)
        commit = Commit(e.git_commit, date, subject)
        for scenario in run.scenarios:
            groups.setdefault((machine_of(run), scenario), []).append(Run(commit, run.created_at, path, run))
    if not groups:
        raise UserError(
            f"no result file under {', '.join(map(str, paths))}; give the folders `bench run` wrote"
        )
    for name, failed in failures:  # a failed commit has no machine of its own: it shows where its scenario is
        for (_, scenario), runs in groups.items():
            if scenario in name.split("+"):
                runs.append(failed)
    histories = [
        _history(machine, scenario, runs, factor, alpha)
        for (machine, scenario), runs in sorted(groups.items())
    ]
    return [h for h in histories if h.cases]  # a scenario of verify records only has no time to follow


def _history(machine: str, scenario: str, runs: list[Run], factor: float, alpha: float) -> History:
    runs = sorted(runs, key=lambda r: r.order)
    keys = list(
        dict.fromkeys(
            c.key for r in runs if r.run is not None for c in r.run.cases if c.case.scenario == scenario
        )
    )
    cases = []
    for key in keys:
        results = []
        for r in runs:
            found = None if r.run is None else r.run.get(key)
            results.append(found if found is not None and found.status == "ok" and found.rounds else None)
        measured = [(i, clean_medians(res)[0]) for i, res in enumerate(results) if res is not None]
        steps = change_points([m for _, m in measured if m], factor=factor, alpha=alpha)
        index = [i for i, m in measured if m]
        changes = [dataclasses.replace(c, index=index[c.index]) for c in steps]
        cases.append(CaseHistory(key, results, changes, _memory_steps(results)))
    return History(machine, scenario, runs, cases)


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
