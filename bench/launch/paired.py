"""Paired rounds for `bench compare REF REF`: both refs' gdn_cp measured in one lifetime of the ranks.

Why: on a shared VM a case's time differs between lifetimes of its ranks by more than the changes worth
catching (about 13%, bimodal, on the 2-core VM this was built on), and unpaired rounds (each side's rounds
lifetimes of its own, bench.launch.interleave) carry that difference into the ratio's interval. Paired,
each round of a case is one lifetime in which both refs' layers are built and timed pass by pass in turn
(bench.measure.rank.measure_pair_on_rank); what the lifetime shares is in both and cancels in the ratio
(bench.measure.statistics.paired_ratio_interval). A round costs one pool start for both sides, not one
`bench run` process per side.

What runs: this checkout's bench (scheduling, timing, memory, contention: the harness) with each ref's
gdn_cp, loaded from its worktree (bench.measure.library). A change to bench itself is therefore not what
is measured; `bench compare --unpaired` runs each ref's own bench instead. Each side's file records its
ref's commit (Environment.git_commit) and the harness's (RunResult.measured_by), and each round the id of
the lifetime both sides shared (RoundResult.lifetime), which is how `bench compare` knows the rounds pair.

Rounds are `bench run`'s (bench.launch.sweep, bench.launch.schedule): every round a seeded shuffle of the
cases, a pool per CP degree. A case whose round fails (on either side: one lifetime runs both) is recorded
as failed on both sides and runs no further rounds; the others go on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.errors import UserError
from bench.launch.devices import host_device_name
from bench.launch.interleave import Checkout
from bench.launch.launcher import LocalLauncher, Outcome, prepare_launch
from bench.launch.schedule import Slot, new_seed
from bench.launch.sweep import judge_with_earlier, recent_windows, round_slots, with_round
from bench.measure.library import BackendImportError, LibraryError, load_library
from bench.measure.rank import PairedCase, measure_pair_on_rank
from bench.results.env import collect_environment, commit_info, git_info
from bench.results.store import NOT_COMPARABLE, CaseResult, ResultWriter, RunResult
from bench.suite.config import Case
from bench.suite.loader import Suite
from bench.suite.selection import Selection, run_device
from gdn_cp.distributed import resolve_platform


@dataclass(frozen=True, slots=True)
class PairedSides:
    """The two refs of a paired compare: their worktrees and result files, base first."""

    roots: tuple[str, str]
    writers: tuple[ResultWriter, ResultWriter]


def check_libraries(roots: Sequence[str], labels: Sequence[str]) -> None:
    """Load each worktree's gdn_cp in this process once before any rank starts: a ref whose gdn_cp cannot
    be loaded beside this checkout's, lacks what the harness builds a case with, or with which a module
    imported for its backends does not import, is one UserError."""
    for root, label in zip(roots, labels, strict=True):
        try:
            load_library(root)
        except BackendImportError as exc:
            raise UserError(
                f"{label}: backend module {exc.module} does not import with this ref's gdn_cp "
                f"({exc.reason}); a module named for its backends must import on both sides of a compare"
            ) from None
        except LibraryError as exc:
            raise UserError(
                f"{label}: its gdn_cp cannot be measured paired ({exc}); compare with --unpaired, which runs "
                "each ref's own bench in lifetimes of its own"
            ) from None


def _runnable(
    cases: Sequence[Case], roots: Sequence[str], labels: Sequence[str], writers: Sequence[ResultWriter]
) -> list[Case]:
    """The cases both refs' gdn_cp can run as named; every other one is written to both files as skipped,
    not comparable, naming what each ref lacks (bench.measure.library.Library.unsupported): a field silently
    dropped would time a ref's own default under the case's name."""
    runnable = []
    for case in cases:
        gaps = [
            f"{label} has no {', '.join(lacking)}"
            for root, label in zip(roots, labels, strict=True)
            if (lacking := load_library(root).unsupported(case))
        ]
        if not gaps:
            runnable.append(case)
            continue
        for writer in writers:
            writer.add(CaseResult(case=case, status="skipped", error=NOT_COMPARABLE + "; ".join(gaps)))
    return runnable


def _side(outcome: Outcome, side: int) -> Outcome:
    """One side's outcome of a paired launch (a failure is both sides')."""
    if outcome.status != "ok" or outcome.results is None:
        return outcome
    return dataclasses.replace(outcome, results=outcome.results[side])


def run_paired_rounds(
    cases: Sequence[Case],
    launcher: LocalLauncher,
    sides: PairedSides,
    *,
    seed: int,
    stop_after: int | None = None,
    previous: tuple[Sequence[CaseResult], Sequence[CaseResult]] = ((), ()),
    on_start: Callable[[Slot], None] = lambda slot: None,
    on_done: Callable[[Slot, tuple[CaseResult, CaseResult]], None] = lambda slot, results: None,
) -> tuple[list[CaseResult], list[CaseResult]]:
    """Every case's missing rounds, each round one lifetime measuring both sides (module docstring); both
    results written after every round. `previous`: both sides' results to continue (rounds added by
    `bench compare --budget`). `launcher` runs bench.measure.rank.measure_pair_on_rank. Returns both sides'
    results of `cases`, in their order."""
    recent = recent_windows()
    keys = {c.key() for c in cases}
    latest = [{p.key: p for p in side if p.status == "ok" and p.key in keys} for side in previous]
    done = {key: len(r.rounds) for key, r in latest[0].items()}
    ended: set[str] = set()
    slots = round_slots(cases, launcher, done=done, ended=ended, seed=seed, stop_after=stop_after)
    measured: set[str] = set()  # cases with a round in this run: the gate's checks ran in their first
    with contextlib.closing(slots):
        for slot, runner in slots:
            on_start(slot)
            key = slot.case.key()
            # the side that opens the timed turns alternates by round (time_passes)
            paired = PairedCase(
                case=slot.case, roots=sides.roots, first=slot.round % 2, first_round=key not in measured
            )
            measured.add(key)
            outcome = runner.run(paired)
            base, head = _side(outcome, 0), _side(outcome, 1)
            judge_with_earlier(base, recent)
            if base.results is not None and head.results is not None:  # one window: one judgement
                head.results.contention = base.results.contention
            results = tuple(
                with_round(latest[i].get(key), slot.case, o, slot.position)
                for i, o in enumerate((base, head))
            )
            for i, result in enumerate(results):
                latest[i][key] = result
                sides.writers[i].add(result)
            if results[0].status == "ok":
                done[key] = len(results[0].rounds)
            else:
                ended.add(key)
            on_done(slot, (results[0], results[1]))
    out = tuple([side[c.key()] for c in cases if c.key() in side] for side in latest)
    return out[0], out[1]


@dataclass(kw_only=True, slots=True)
class PairedSession:
    """A paired compare set up before any rank starts: the cases, the launcher of measure_pair_on_rank, both
    sides' files and the schedule seed they share; `run` adds rounds to it."""

    cases: list[Case]
    launcher: LocalLauncher
    sides: PairedSides
    seed: int

    @classmethod
    def open(
        cls,
        checkouts: Sequence[Checkout],
        selections: Sequence[Selection],
        suite: Suite,
        *,
        repo: Path,
        name: str,
        most_rounds: int | None = None,
    ) -> PairedSession:
        """Check both refs' gdn_cp load beside this one and every case against this host (preflight), then
        create both result files. `most_rounds`: the rounds a case may get in all (`bench compare --budget`;
        default its scenario's)."""
        roots = tuple(str(c.root.resolve()) for c in checkouts)
        labels = [f"{c.name} {c.side.label}" for c in checkouts]
        check_libraries(roots, labels)
        platform = resolve_platform(run_device(suite.config.device, selections))
        launcher = prepare_launch(platform, None, suite, selections, measure_pair_on_rank)
        assert isinstance(launcher, LocalLauncher)  # no job: local pools
        cases = [c for s in selections for c in s.cases]
        if most_rounds is not None:
            cases = [dataclasses.replace(c, rounds=most_rounds) for c in cases]
        harness = git_info()
        seed, session = new_seed(), uuid.uuid4().hex
        scenarios = {s.scenario.name: s.scenario.to_dict() for s in selections}
        if most_rounds is not None:
            scenarios = {k: {**v, "rounds": most_rounds} for k, v in scenarios.items()}
        writers = []
        for checkout in checkouts:
            run = RunResult(
                name=name,
                environment=collect_environment(
                    platform,
                    device_name=host_device_name(platform),
                    threads_per_rank=suite.config.threads_per_rank,
                    world_sizes=[c.cp for c in cases],
                    launcher="local",
                    git=commit_info(repo, checkout.side.commit),
                ),
                suite=suite.config,
                scenarios=scenarios,
                schedule_seed=seed,
                session=session,
                measured_by=harness.commit + ("+dirty" if harness.dirty else ""),
            )
            writers.append(ResultWriter(checkout.output, run))
        cases = _runnable(cases, roots, labels, writers)
        return cls(
            cases=cases, launcher=launcher, sides=PairedSides(roots, (writers[0], writers[1])), seed=seed
        )

    @property
    def runs(self) -> tuple[RunResult, RunResult]:
        """Both sides' runs as their files hold them now."""
        return self.sides.writers[0].run, self.sides.writers[1].run

    def run(
        self,
        stop_after: int,
        keys: Collection[str] | None = None,
        *,
        on_start: Callable[[Slot], None] = lambda slot: None,
        on_done: Callable[[Slot, tuple[CaseResult, CaseResult]], None] = lambda slot, results: None,
        repeats: Mapping[str, int] | None = None,
    ) -> tuple[RunResult, RunResult]:
        """Rounds up to `stop_after` for the cases (of `keys`; None: all), continuing what the files hold;
        both runs after them. `repeats`: timed passes per side in these rounds, by case key (default: the
        case's own `repeat`); each round's samples keep their own count."""
        repeats = repeats or {}
        cases = [
            dataclasses.replace(c, repeat=repeats.get(c.key(), c.repeat))
            for c in self.cases
            if keys is None or c.key() in keys
        ]
        runs = self.runs
        run_paired_rounds(
            cases,
            self.launcher,
            self.sides,
            seed=self.seed,
            stop_after=stop_after,
            previous=(runs[0].cases, runs[1].cases),
            on_start=on_start,
            on_done=on_done,
        )
        return self.runs
