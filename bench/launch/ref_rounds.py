"""Running git refs for `bench compare` and `bench gate`: both sides' cases measured, round after round,
into a result file per side, and with a budget more rounds for the cases not yet decided.

Two refs are measured paired (bench.launch.paired: both refs' gdn_cp in each lifetime of the ranks, this
checkout's bench measuring), or unpaired, each ref's own bench in lifetimes of its own, round by round in
turn (bench.launch.interleave); a ref against a result file runs only the ref. The refs are checked out in
temporary worktrees, removed at the end, on Ctrl-C and on SIGTERM; finished cases stay in their files.

With a budget (`measure_refs(budget_s=...)`), after the planned rounds every case is judged at each look
of `look_rounds` at the alpha `sequential_alpha` spends per look; the undecided cases the budget can bring
to a verdict (`promising`) get rounds up to the next look. docs/measurement.md gives the figures behind
ADAPTIVE_MAX_ROUNDS and ADDED_ROUND_TIMED_S.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.markup import escape

from bench.console import CaseProgress
from bench.errors import first_line
from bench.formats import format_time
from bench.judge.comparison import JUDGED_VERDICTS, Comparison, compare_runs, look_rounds, sequential_alpha
from bench.launch import interleave
from bench.launch.gitrefs import FileSide, RefSide, Side, repo_root, worktree
from bench.launch.interleave import Checkout
from bench.launch.launcher import sigterm_as_interrupt
from bench.launch.paired import PairedSession
from bench.launch.schedule import Slot, slots_left
from bench.measure.statistics import rounds_to_decide
from bench.results.paths import free_path, result_filename
from bench.results.store import CaseResult, RunResult, load_result
from bench.suite.loader import Suite, display
from bench.suite.selection import Selection

ADAPTIVE_MAX_ROUNDS = 60
"""The most rounds a budget gives a case: its scenario's rounds are raised to this, so that a side's file
can be resumed round after round; the budget usually ends sooner."""

ADDED_ROUND_TIMED_S = 0.3
"""A round a budget adds to a case (paired) times at least this many seconds of each side's passes: its
repeat is raised to an even count of at least ceil(this / the pass's estimate) (`added_repeats`), since
what is left undecided is mostly short passes, whose rounds vary by the noise of a median of a few repeats
while a round's cost is mostly its lifetime's start."""


class SidePaths(NamedTuple):
    """Both sides' result files, and with a budget the alpha every look judged at (`sequential_alpha`):
    the verdicts are those at that alpha (a case decided at a look got no rounds after it)."""

    paths: list[Path]
    alpha: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Budget:
    """More rounds for the undecided cases: until each is decided or `seconds` are spent, judged as
    bench.judge.comparison judges them (factor, alpha)."""

    seconds: float
    factor: float
    alpha: float


def measure_refs(
    sides: Sequence[Side],
    suite: Suite,
    selections: Sequence[Selection],
    folder: Path,
    *,
    sets: Sequence[str],
    device: str | None,
    console: Console,
    runner: interleave.Runner = interleave.run_on_side,
    budget: Budget | None = None,
    paired: bool = True,
) -> SidePaths:
    """The result file of each side, base then head: a file side's own, a ref side's from running the
    selected cases on it (its file in `folder`). `sets`, `device`: the words each ref's own bench runs with
    (unpaired). Progress on `console`. Raises KeyboardInterrupt when interrupted (finished cases stay in
    their files)."""
    started = time.monotonic()
    repo = repo_root(Path.cwd())
    assert repo is not None  # resolve_side found the refs in it
    now = datetime.datetime.now()
    name = "+".join(s.scenario.name for s in selections if s.cases)
    planned = max(c.rounds for s in selections for c in s.cases)
    outputs = [
        s.path if isinstance(s, FileSide) else free_path(folder / f"{role}-{_file_name(now, s, name)}")
        for role, s in zip(("base", "head"), sides, strict=True)
    ]
    # SIGTERM (a CI job cancelled) stops like Ctrl-C: the worktrees are removed, finished cases kept
    with (
        sigterm_as_interrupt(),
        tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp_dir,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_dir)
        checkouts = _checkouts(stack, repo, sides, outputs, tmp)
        _announce(checkouts, selections, planned, folder, paired, console)
        try:
            # with a budget a case may get ADAPTIVE_MAX_ROUNDS (resumable round after round); the planned
            # rounds run first, as without one
            most = ADAPTIVE_MAX_ROUNDS if budget is not None else None
            both = paired and len(checkouts) == 2
            if both:
                more = _paired_rounds(checkouts, selections, suite, repo, name, most, planned, console)
            else:
                staged = interleave.stage(selections, suite, tmp / "definitions")
                side_sets = [*sets, f"rounds={most}"] if most is not None else list(sets)
                more = _unpaired_rounds(
                    checkouts, staged, outputs, sets=side_sets, device=device, runner=runner, console=console
                )
            runs = more(planned, None, {})
            spent = None
            if budget is not None:
                timed_s = ADDED_ROUND_TIMED_S if both else None
                spent = _add_rounds(
                    runs, more, planned, budget, started=started, console=console, timed_s=timed_s
                )
        except KeyboardInterrupt:
            kept = [str(display(o)) for o in outputs if o.exists()]
            console.print(f"[yellow]interrupted[/]: worktrees removed{_kept(kept)}")
            raise
    console.print(_saved_line(outputs, spent))
    return SidePaths(outputs, spent)


def _checkouts(
    stack: contextlib.ExitStack, repo: Path, sides: Sequence[Side], outputs: Sequence[Path], tmp: Path
) -> list[Checkout]:
    """A worktree per ref side in `tmp` (removed when `stack` closes), with the file it writes."""
    return [
        Checkout(
            name=role,
            side=side,
            root=stack.enter_context(worktree(repo, side.commit, tmp / role)),
            output=out,
        )
        for role, side, out in zip(("base", "head"), sides, outputs, strict=True)
        if isinstance(side, RefSide)
    ]


def _kept(kept: Sequence[str]) -> str:
    return f"; finished cases are in {escape(', '.join(kept))}" if kept else ""


def _saved_line(outputs: Sequence[Path], spent: float | None) -> str:
    """Where both sides' files are, and how to compare them again (at the budget's alpha, with one)."""
    return (
        "saved: "
        + ", ".join(f"{role} {escape(display(o))}" for role, o in zip(("base", "head"), outputs, strict=True))
        + "; compare them again with `bench compare BASE.json HEAD.json"
        + (f" --alpha {spent:.4g}` (the budget's alpha)" if spent is not None else "`")
    )


def _file_name(now: datetime.datetime, side: RefSide, name: str) -> str:
    return result_filename(now, side.spec, side.commit, name)


def _announce(
    checkouts: Sequence[Checkout],
    selections: Sequence[Selection],
    planned: int,
    folder: Path,
    paired: bool,
    console: Console,
) -> None:
    """The opening line: how many cases and rounds run on which refs, how, and where the files go."""
    n_cases = sum(len(s.cases) for s in selections)
    order = " and ".join(f"{c.name} {c.side.label}" for c in checkouts)
    how = ""
    if len(checkouts) > 1:
        how = (
            ", paired: both in each lifetime of the ranks, pass by pass in turn"
            if paired
            else ", each with its own bench, round by round in turn"
        )
    console.print(
        f"running {n_cases} cases x {planned} rounds on {escape(order)}{how}; results in "
        f"{escape(display(folder))}"
    )


MoreRounds = Callable[[int, Collection[str] | None, Mapping[str, int]], tuple[RunResult, RunResult]]
"""more(stop_after, keys, repeats): run rounds up to `stop_after` of the cases of `keys` (None: every
planned case) on both sides, with `repeats` timed passes by case key (missing: the case's repeat; paired
rounds only); both sides' runs after them."""


def _paired_rounds(
    checkouts: Sequence[Checkout],
    selections: Sequence[Selection],
    suite: Suite,
    repo: Path,
    name: str,
    most: int | None,
    planned: int,
    console: Console,
) -> MoreRounds:
    """Rounds of both refs in shared lifetimes (bench.launch.paired), a status line per case and round."""
    session = PairedSession.open(checkouts, selections, suite, repo=repo, name=name, most_rounds=most)

    def more(
        stop_after: int, keys: Collection[str] | None, repeats: Mapping[str, int]
    ) -> tuple[RunResult, RunResult]:
        cases = [c for c in session.cases if keys is None or c.key() in keys]
        done = {c.key: len(c.rounds) for c in session.runs[0].cases if c.status == "ok"}
        with CaseProgress(console, slots_left(cases, done, stop_after), unit="case-rounds") as progress:
            return session.run(
                stop_after,
                keys,
                on_start=lambda slot: progress.start(f"{slot.case.key()} round {slot.round + 1}"),
                on_done=lambda slot, pair: progress.done(_paired_line(slot, pair, planned)),
                repeats=repeats,
            )

    return more


def _paired_line(slot: Slot, pair: tuple[CaseResult, CaseResult], planned: int) -> str:
    """A paired case-round's status line: each side's estimate so far, or why the round failed."""
    base, head = pair
    where = f"r{slot.round + 1}/{max(planned, slot.round + 1)} {escape(slot.case.case_id):<36}"
    if base.status != "ok" or head.status != "ok":
        return f"[red]failed[/]  {where} {escape(first_line(base.error or head.error))}"
    shared = "  [bold yellow]contended[/]" if base.rounds[-1].contended else ""
    return (
        f"[green]ok[/]      {where} base {escape(format_time(base, contended_mark=False))}, head "
        f"{escape(format_time(head, contended_mark=False))}{shared}"
    )


def _unpaired_rounds(
    checkouts: Sequence[Checkout],
    staged: interleave.Staged,
    outputs: Sequence[Path],
    *,
    sets: Sequence[str],
    device: str | None,
    runner: interleave.Runner,
    console: Console,
) -> MoreRounds:
    """Rounds of each ref with its own bench, in turn (bench.launch.interleave), a status line per side and
    round; a ref against a result file runs the ref alone. `outputs`: both sides' files, base first."""
    started: set[str] = set()
    done = 0

    def more(
        stop_after: int, keys: Collection[str] | None, repeats: Mapping[str, int]
    ) -> tuple[RunResult, RunResult]:
        nonlocal done
        # each side's own `bench run` times its scenario's repeat: one --set for all its cases
        assert not repeats, "unpaired rounds run the scenario's repeat"
        subset = staged
        if keys is not None:
            subset = dataclasses.replace(staged, plan=[p for p in staged.plan if p.case.key() in keys])
        rounds = range(done + 1, stop_after + 1)
        with CaseProgress(console, len(rounds) * len(checkouts), unit="rounds") as progress:
            interleave.run_alternating(
                checkouts,
                subset,
                rounds,
                started=started,
                sets=sets,
                device=device,
                runner=runner,
                on_start=lambda c, k: progress.start(f"{c.name} round {k}/{stop_after}"),
                on_done=lambda c, k, run: progress.done(_round_line(c, k, stop_after, run)),
            )
        done = stop_after
        return load_result(outputs[0]), load_result(outputs[1])

    return more


def _add_rounds(
    runs: tuple[RunResult, RunResult],
    more: MoreRounds,
    planned: int,
    budget: Budget,
    *,
    started: float,
    console: Console,
    timed_s: float | None = None,
) -> float:
    """After the planned rounds, judge every case at each look of `look_rounds` (at `sequential_alpha`); a
    case judged (better, worse, ~) or not comparable is decided and gets no more rounds; of the others, those
    the budget can bring to a verdict (`promising`) get rounds up to the next look, one round at a time,
    while the next round fits before the deadline (its cost: the last round's, both sides and start-up
    included; at first the planned rounds' mean). With `timed_s`, those rounds time at least that long of
    each side's passes (`added_repeats`). Returns the alpha every look judged at."""
    looks = look_rounds(planned, ADAPTIVE_MAX_ROUNDS)
    spent = sequential_alpha(budget.alpha, len(looks))
    deadline = started + budget.seconds
    decided: set[str] = set()
    done = planned
    cost = (time.monotonic() - started) / max(done, 1)
    for next_look in [*looks[1:], None]:
        comparison = compare_runs(*runs, factor=budget.factor, alpha=spent)
        decided |= {c.key for c in comparison.cases if c.verdict in JUDGED_VERDICTS | {"not comparable"}}
        undecided = [c.key for c in comparison.cases if c.key not in decided]
        if not undecided or next_look is None:
            break
        repeats = added_repeats(comparison, undecided, timed_s) if timed_s is not None else {}
        open_keys = promising(
            comparison,
            undecided,
            done=done,
            next_look=next_look,
            remaining_s=deadline - time.monotonic(),
            repeats=repeats,
            alpha=spent,
        )
        waiting = len(undecided) - len(open_keys)
        console.print(
            f"round {done}: {len(undecided)} case(s) undecided at alpha {spent:.4f}; rounds to {next_look} "
            f"for {len(open_keys)}" + (f", {waiting} projected past the budget wait" if waiting else "")
        )
        while done < next_look:
            if time.monotonic() + cost > deadline:
                console.print(f"budget spent: {len(undecided)} case(s) undecided after {done} rounds")
                return spent
            done += 1
            begun = time.monotonic()
            runs = more(done, open_keys, repeats)
            cost = time.monotonic() - begun
    return spent


def promising(
    comparison: Comparison,
    keys: Sequence[str],
    *,
    done: int,
    next_look: int,
    remaining_s: float,
    repeats: Mapping[str, int],
    alpha: float,
) -> list[str]:
    """The undecided cases of `keys` worth the budget's next rounds, most promising first: each case's
    projected cost to a verdict (the rounds it still needs by `rounds_to_decide`, at least those to
    `next_look`, times its last round's wall time, scaled to its `repeats`) is summed in order of that cost
    while the sum fits `remaining_s`; the first case always; a case without an interval (its rounds
    contended) counts the rounds to `next_look`. A case whose estimate sits on a boundary
    (a head 1.05x slower, against factor 1.05) would take every round the budget has and still be too noisy;
    those close to a verdict get the rounds instead. Projections only order the spending: each look still
    judges at its alpha, so the false-verdict rate is as without them (`sequential_alpha`)."""
    costs = []
    for c in comparison.cases:
        if c.key not in keys:
            continue
        # no interval yet (rounds contended): its spread is unknown, so it gets the look's rounds
        projected = next_look if c.low is None else rounds_to_decide(c.interval, comparison.factor, alpha)
        need = max(projected, next_look) - done
        last_b, last_h = c.base.rounds[-1], c.head.rounds[-1]
        # paired: one lifetime timed both sides (the same wall); unpaired: a lifetime each
        wall = max(last_b.wall_s, last_h.wall_s) if c.paired else last_b.wall_s + last_h.wall_s
        passes = len(last_b.samples_s[0])
        costs.append((need * wall * max(1.0, repeats.get(c.key, passes) / passes), c.key))
    costs.sort()
    chosen, total = [], 0.0
    for cost, key in costs:
        if chosen and total + cost > remaining_s:
            break
        chosen.append(key)
        total += cost
    return chosen


def added_repeats(comparison: Comparison, keys: Collection[str], timed_s: float) -> dict[str, int]:
    """The timed passes per side of a round added to each case of `keys` (ADDED_ROUND_TIMED_S): an even
    count (ABBA turns even out within the round) of at least its repeat and ceil(timed_s / the faster
    side's estimate). A case without an estimate on both sides keeps its repeat."""
    out = {}
    for c in comparison.cases:
        if c.key not in keys or c.base.estimate is None or c.head.estimate is None:
            continue
        fastest = min(c.base.estimate.median_s, c.head.estimate.median_s)
        wanted = max(c.base.case.repeat, math.ceil(timed_s / fastest))
        out[c.key] = wanted + wanted % 2
    return out


def _round_line(checkout: Checkout, round_: int, rounds: int, run: RunResult) -> str:
    """One status line per side and round: how many cases are ok and failed so far."""
    ok = sum(c.status == "ok" for c in run.cases)
    failed = [c for c in run.cases if c.status == "failed"]
    line = f"{escape(checkout.name):<4} round {round_}/{rounds}: [green]{ok} ok[/]"
    if failed:
        line += (
            f", [red]{len(failed)} failed[/] ({escape(failed[0].key)}: {escape(first_line(failed[0].error))})"
        )
    return line
