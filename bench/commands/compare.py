"""`bench compare BASE HEAD [SCENARIO ...]`: is head faster or slower than base, case by case?

BASE and HEAD are each a result file (when the path exists) or a git ref. Two files are compared as they
are. A ref is checked out in a temporary worktree and the scenarios of the current working tree run on it
(identical for both sides); both sides' result files are kept (results/compare-<date>/, or --save-dir) so
that they can be compared again later. Two refs are measured paired (bench.launch.paired): each round of a
case is one lifetime of the ranks in which base's and head's gdn_cp both run, pass by pass in turn, measured
by this checkout's bench, so that what a lifetime shares cancels in the ratio. `--unpaired` runs each ref's
own bench instead (a change to bench itself), base and head round by round in turn
(bench.launch.interleave). A ref against a file runs only the ref, with its own bench, on the file's cases.

Per case ok on both sides (bench.results.comparison): the ratio head/base of the round-level estimates
with its (1 - alpha) confidence interval (paired, or Welch's between unpaired rounds), a verdict (better /
worse only when the whole interval lies past --factor, ~ when it lies within 1/factor .. factor, else too
noisy), the smallest change the data could detect, and the peak-memory delta. Rounds of two
refs run in one session, so drift on the machine spreads over both; two files measured at different times
are compared too, with a note that drift between them is not controlled. Cases from different machines,
devices, torch versions or scenario definitions are "not comparable" unless --force.

Exit code: 0; 1 for a user error, or with --fail-on-regression when nothing was compared (head has no cases,
or no case is ok and comparable on both sides); 3 with --fail-on-regression when a case is worse, or ok on
base but failed on head; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import re
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, get_args

from rich.console import Console
from rich.markup import escape

from bench.commands import common_args
from bench.console import CaseProgress, print_error, print_warning
from bench.console import console as default_console
from bench.errors import UserError, first_line
from bench.launch import interleave
from bench.launch.gitrefs import FileSide, RefSide, Side, repo_root, resolve_side, worktree
from bench.launch.interleave import Checkout
from bench.launch.launcher import sigterm_as_interrupt
from bench.launch.paired import PairedSession
from bench.launch.schedule import Slot, slots_left
from bench.render.document import Table as DocTable
from bench.render.document import markdown_table, markdown_text
from bench.results.analysis import source_label
from bench.results.comparison import (
    DEFAULT_ALPHA,
    DEFAULT_FACTOR,
    JUDGED_VERDICTS,
    CaseComparison,
    Comparison,
    Verdict,
    compare_runs,
    look_rounds,
    sequential_alpha,
)
from bench.results.export import measure_cells
from bench.results.paths import free_path, new_folder
from bench.results.statistics import format_estimate, rounds_to_decide
from bench.results.store import CaseResult, RunResult, load_result, result_filename
from bench.results.tables import TableData, format_time, print_tables
from bench.suite.filters import CaseFilter, parse_filters
from bench.suite.loader import Suite, display, load_suite, parse_overrides
from bench.suite.selection import Selection, select

NAME = "compare"
HELP = (
    "Compare two result files or git refs case by case (head/base with a 95% interval from rounds, verdict, "
    "peak memory). Exit 3 with --fail-on-regression when a case got worse."
)
EXIT_REGRESSION = 3
"""--fail-on-regression and a case got worse: distinct from 1 (user error) and 2 (bench run: cases failed)."""
EXIT_NO_VERDICT = 6
"""--fail-on-regression and no case got a verdict (every one too noisy, contended or not comparable): a gate
that judged nothing fails, as `bench gate` does."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "A side that is an existing file is a result file; otherwise a git ref, checked out in a temporary "
        "worktree, running the scenarios of this working tree (identical for both sides); two refs are "
        "measured paired (both refs' gdn_cp in each lifetime of the ranks, this checkout's bench measuring; "
        "--unpaired: each ref's own bench); both result files are kept for a later comparison. "
        "Exit codes: 0 compared (whatever the verdicts); 1 user error, or --fail-on-regression with nothing "
        f"compared; {EXIT_REGRESSION} with --fail-on-regression when a case is worse, or ok on base but "
        f"failed on head; {EXIT_NO_VERDICT} with --fail-on-regression when no case got a verdict (all too "
        "noisy, contended or not comparable); 130 interrupted."
    )
    parser.add_argument("base", metavar="BASE", help="result file, or git ref (branch, tag, commit) to run")
    parser.add_argument("head", metavar="HEAD", help="result file, or git ref to run")
    common_args.add_scenarios(
        parser,
        "with a ref: scenario names or .yaml paths to run on both sides (default: the suite's "
        "default_scenario; against a result file: that file's scenarios); --filter also narrows two files",
    )
    common_args.add_device(parser)
    common_args.add_config(parser)
    parser.add_argument(
        "--factor",
        type=float,
        default=DEFAULT_FACTOR,
        help=f"a case is better/worse only when head/base passes this factor (default {DEFAULT_FACTOR})",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help=f"the ratio's interval has confidence 1 - alpha (default {DEFAULT_ALPHA}: 95%%)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="compare cases that are not comparable (other machine, device, torch, scenario), with a warning",
    )
    parser.add_argument(
        "--format",
        dest="fmt",
        choices=FORMATS,
        default="table",
        help="table (terminal), markdown (a PR comment) or json (verdicts, ratios, intervals and the change "
        "each case could detect, for CI bots and dashboards)",
    )
    parser.add_argument(
        "--budget",
        type=parse_budget,
        metavar="DURATION",
        help="with two git refs: after the planned rounds, keep adding rounds to the cases not yet decided "
        "until each is called or DURATION (90s, 10m, 1h) is spent; verdicts by alpha spending, the "
        "false-verdict rate still at most --alpha",
    )
    add_unpaired(parser)
    parser.add_argument(
        "--fail-on-regression",
        action="store_true",
        help=f"exit {EXIT_REGRESSION} when any case is worse, or ok on base but failed on head (CI gates)",
    )
    parser.add_argument(
        "--save-dir",
        metavar="DIR",
        help="with refs: where both sides' result files go (default: <results_dir>/compare-<date>-<time>)",
    )


def add_unpaired(parser: argparse.ArgumentParser) -> None:
    """--unpaired (compare, gate)."""
    parser.add_argument(
        "--unpaired",
        action="store_true",
        help="with two refs: run each ref's own bench in lifetimes of its own, round by round in turn, "
        "instead of both refs' gdn_cp paired in each lifetime (use it when bench itself changed; its "
        "intervals carry the lifetimes' differences)",
    )


def main(args: argparse.Namespace) -> int:
    return run(
        args.base,
        args.head,
        args.scenarios,
        sets=args.sets,
        filters=args.filters,
        device=args.device,
        config=args.config,
        factor=args.factor,
        alpha=args.alpha,
        force=args.force,
        fmt=args.fmt,
        budget_s=args.budget,
        fail_on_regression=args.fail_on_regression,
        save_dir=args.save_dir,
        paired=not args.unpaired,
    )


# ----------------------------------------------------------------------------------------------------------
# Running refs


def _narrow(run: RunResult, case_filter: CaseFilter) -> RunResult:
    return dataclasses.replace(run, cases=[c for c in run.cases if case_filter.matches(c.case)])


ADAPTIVE_MAX_ROUNDS = 60
"""The most rounds `--budget` gives a case (its scenario's rounds are raised to this, so that a side's file
can be resumed round after round); the budget usually ends sooner. At 30, a 15-minute budget on cpu-smoke
stopped after 8 minutes with 11 cases undecided; each look more costs little (alpha / 6 instead of / 4)."""

ADDED_ROUND_TIMED_S = 0.3
"""A round `--budget` adds to a case (paired) times at least this many seconds of each side's passes: its
repeat is raised to an even count of at least ceil(this / the pass's estimate) (`added_repeats`). Why:
what is left undecided is mostly short passes, whose rounds vary by the pass-to-pass noise of a median of
a few repeats (cp 2 forwards of 14 ms: 13-16% pass to pass with 2 ranks on 2 cores), while a round's cost
is mostly its lifetime's start: such a case's part of a round went from 0.15 s (3 passes a side) to 0.75 s
(24-26), and a 1.10x head's 19 forward cases were all called within a 15-minute budget (17 before)."""


class SidePaths(NamedTuple):
    """Both sides' result files, and with --budget the alpha every look judged at (`sequential_alpha`):
    the verdicts are those at that alpha (a case decided at a look got no rounds after it)."""

    paths: list[Path]
    alpha: float | None = None


def parse_budget(text: str) -> float:
    """`--budget 10m` -> 600.0 seconds (s, m or h; a bare number is seconds); ArgumentTypeError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive duration, e.g. 90s, 10m or 1h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def side_paths(
    sides: Sequence[Side],
    scenarios: Sequence[str],
    *,
    sets: Sequence[str],
    filters: Sequence[str],
    device: str | None,
    config: str | None,
    save_dir: str | None,
    console: Console,
    runner: interleave.Runner = interleave.run_on_side,
    budget_s: float | None = None,
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
    paired: bool = True,
) -> SidePaths:
    """The result file of each side, base then head: a file side's own, a ref side's from running the
    selected cases on it. Two refs are measured paired (bench.launch.paired: both refs' gdn_cp in each
    lifetime of the ranks, this checkout's bench measuring), or with `paired` False each with its own bench,
    alternating round by round (bench.launch.interleave, through `runner`); progress on `console`. With
    `budget_s` (two refs only), rounds are then added to the cases not yet decided until each is decided or
    the budget is spent (`_add_rounds`). Raises KeyboardInterrupt when interrupted (finished cases stay in
    their files), UserError for run options given with two files."""
    if all(isinstance(s, FileSide) for s in sides):
        if scenarios or sets or device or budget_s is not None:
            raise UserError(
                "scenarios, --set, --device and --budget choose what to run, but two result files run "
                "nothing; drop them (--filter narrows the files' cases), or give git refs to run"
            )
        return SidePaths([s.path for s in sides if isinstance(s, FileSide)])
    if budget_s is not None and any(isinstance(s, FileSide) for s in sides):
        raise UserError("--budget adds rounds to both sides, so both must be git refs, not a result file")
    started = time.monotonic()
    overrides = parse_overrides(sets, device)
    suite = load_suite(config, overrides)
    file_run = next((load_result(s.path) for s in sides if isinstance(s, FileSide)), None)
    names = list(scenarios) or (list(file_run.scenarios) if file_run is not None else [])
    selections = select(suite, names, overrides, parse_filters(filters))
    if file_run is not None:  # against a file: only what the file can be compared on
        keys = {c.key for c in file_run.cases}
        selections = [
            dataclasses.replace(s, cases=[c for c in s.cases if c.key() in keys]) for s in selections
        ]
    if not any(s.cases for s in selections):
        listed = ", ".join(s.scenario.name for s in selections)
        narrowed = "--filter and the result file's cases" if file_run is not None else "--filter"
        raise UserError(f"no case of {listed} is left after {narrowed}; see `bench list {listed}`")
    fewest = min(c.rounds for s in selections for c in s.cases)
    if (
        file_run is None
        and fewest < suite.config.compare_rounds
        and all(o.key != "rounds" for o in overrides)
    ):
        # two refs: every case gets at least the suite's compare_rounds (both modes run `--set rounds=N`)
        most = max(c.rounds for s in selections for c in s.cases)
        sets = [*sets, f"rounds={max(most, suite.config.compare_rounds)}"]
        overrides = parse_overrides(sets, device)
        selections = select(suite, names, overrides, parse_filters(filters))
    repo = repo_root(Path.cwd())
    assert repo is not None  # resolve_side found the refs in it
    now = datetime.datetime.now()
    folder = Path(save_dir) if save_dir else new_folder(suite.results_dir / f"compare-{now:%Y%m%d-%H%M%S}")
    name = "+".join(s.scenario.name for s in selections if s.cases)
    outputs: list[Path] = []
    planned = max(c.rounds for s in selections for c in s.cases)
    # SIGTERM (a CI job cancelled) stops like Ctrl-C: the worktrees are removed, finished cases kept
    with (
        sigterm_as_interrupt(),
        tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        checkouts = []
        for role, side in zip(("base", "head"), sides, strict=True):
            if isinstance(side, FileSide):
                outputs.append(side.path)
                continue
            root = stack.enter_context(worktree(repo, side.commit, Path(tmp) / role))
            output = free_path(folder / f"{role}-{result_filename(now, side.spec, side.commit, name)}")
            outputs.append(output)
            checkouts.append(Checkout(name=role, side=side, root=root, output=output))
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
        # With a budget a case may get ADAPTIVE_MAX_ROUNDS (the files' scenarios say so, resumable round after
        # round); the planned rounds run first, as without one.
        most = ADAPTIVE_MAX_ROUNDS if budget_s is not None else None
        spent = None
        try:
            if paired and len(checkouts) == 2:
                more = _paired_rounds(checkouts, selections, suite, repo, name, most, planned, console)
            else:
                more = _unpaired_rounds(
                    checkouts,
                    interleave.stage(selections, suite, Path(tmp) / "definitions"),
                    outputs,
                    sets=[*sets, f"rounds={most}"] if most is not None else list(sets),
                    device=device,
                    runner=runner,
                    console=console,
                )
            runs = more(planned, None, {})
            if budget_s is not None:
                spent = _add_rounds(
                    runs,
                    more,
                    planned,
                    factor=factor,
                    alpha=alpha,
                    started=started,
                    deadline=started + budget_s,
                    console=console,
                    timed_s=ADDED_ROUND_TIMED_S if paired and len(checkouts) == 2 else None,
                )
        except KeyboardInterrupt:
            kept = [str(display(o)) for o in outputs if o.exists()]
            console.print(
                "[yellow]interrupted[/]: worktrees removed"
                + (f"; finished cases are in {escape(', '.join(kept))}" if kept else "")
            )
            raise
    console.print(
        "saved: "
        + ", ".join(f"{role} {escape(display(o))}" for role, o in zip(("base", "head"), outputs, strict=True))
        + "; compare them again with `bench compare BASE.json HEAD.json"
        + (f" --alpha {spent:.4g}` (the budget's alpha)" if spent is not None else "`")
    )
    return SidePaths(outputs, spent)


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
        with CaseProgress(console, slots_left(cases, done, stop_after)) as progress:
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
        with CaseProgress(console, len(rounds) * len(checkouts)) as progress:
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
    *,
    factor: float,
    alpha: float,
    started: float,
    deadline: float,
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
    spent = sequential_alpha(alpha, len(looks))
    decided: set[str] = set()
    done = planned
    cost = (time.monotonic() - started) / max(done, 1)
    for next_look in [*looks[1:], None]:
        comparison = compare_runs(*runs, factor=factor, alpha=spent)
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


# ----------------------------------------------------------------------------------------------------------
# Output


VERDICT_STYLES = {
    "better": "green",
    "worse": "bold red",
    "~": "dim",
    "too noisy": "yellow",
    "contended": "yellow",
    "not comparable": "yellow",
}


def _side_label(side: Side, run: RunResult) -> str:
    if isinstance(side, RefSide):
        return side.label
    return f"{side.path.name} ({source_label(run)})"


def _case_name(c: CaseComparison | str, single_scenario: bool) -> str:
    key = c if isinstance(c, str) else c.key
    return key.split("/", 1)[1] if single_scenario else key


def _ratio(c: CaseComparison) -> str:
    """`1.032 [0.981, 1.086]`: head/base and its interval."""
    if c.low is None or c.high is None:
        return f"{c.ratio:.3f}"
    return f"{c.ratio:.3f} [{c.low:.3f}, {c.high:.3f}]"


def _verdict(c: CaseComparison) -> str:
    text = c.verdict + (" (forced)" if c.forced else "")
    if c.verdict == "too noisy" and c.detectable is None:
        rounds = min(c.rounds)
        return f"{text} ({rounds} round{'s' * (rounds != 1)}: no interval)"
    if c.verdict == "contended":
        return f"{text} ({sum(c.contended_rounds)} rounds shared)"
    return text


def _memory(c: CaseComparison) -> str:
    if c.memory_delta_mib is None:
        return "-"
    pct = c.memory_delta_pct
    return f"{c.memory_delta_mib:+.1f} MiB" + ("" if pct is None else f" ({pct:+.1f}%)")


def _detects(c: CaseComparison) -> str:
    """`x1.13`: the smallest head/base this case's data could have called worse (its inverse better)."""
    return "-" if c.detectable is None else f"x{c.detectable:.2f}"


def _cells(c: CaseComparison, single: bool) -> list[str]:
    return [
        _case_name(c, single),
        format_estimate(c.base.estimate),
        format_estimate(c.head.estimate),
        _ratio(c),
        _verdict(c),
        _detects(c),
        _memory(c),
    ]


COLUMNS = ["case", "base", "head", "head/base", "verdict", "detects", "mem delta"]
ALIGN: list = ["left", "right", "right", "right", "left", "right", "right"]
FORMATS = ("table", "markdown", "json")
MAX_LISTED = 8
"""Cases named per reason in the not-compared notes; the rest are counted."""


def _notes(comparison: Comparison, single: bool) -> list[str]:
    """Why cases were not comparable or not compared, and when no verdict was possible."""
    notes = []
    reasons: dict[str, int] = {}
    for c in comparison.cases:
        if c.not_comparable:
            reasons[c.not_comparable] = reasons.get(c.not_comparable, 0) + 1
    for reason, n in reasons.items():
        forced = "compared anyway (--force)" if any(c.forced for c in comparison.cases) else "not comparable"
        notes.append(f"{forced}, {n} case{'s' * (n != 1)}: {reason}")
    by_reason: dict[str, list[str]] = {}
    for n in comparison.not_compared:
        by_reason.setdefault(n.reason, []).append(_case_name(n.key, single))
    for reason, keys in by_reason.items():
        shown = ", ".join(keys[:MAX_LISTED]) + (
            f" and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else ""
        )
        notes.append(f"not compared ({reason}): {shown}")
    if comparison.cases and not comparison.interleaved:
        b, h = comparison.base.created_at, comparison.head.created_at
        notes.append(
            f"drift between the two runs is not controlled: they were measured separately (base {b}, head "
            f"{h}), so a change of the machine between them looks like a change of the code; compare git "
            "refs (`bench compare BASE_REF HEAD_REF`) to run both in one session, rounds interleaved"
        )
    single_round = [c for c in comparison.cases if c.verdict == "too noisy" and c.detectable is None]
    if single_round:
        notes.append(
            f"{len(single_round)} case{'s' * (len(single_round) != 1)} with one round on a side (e.g. a "
            "schema 1 file): no interval between process lifetimes; rerun with --set rounds=3 or more"
        )
    return notes


def _rule(comparison: Comparison) -> str:
    confidence = f"{100 * (1 - comparison.alpha):g}%"
    judged = [c for c in comparison.cases if c.low is not None]  # the cases with an interval
    paired = sum(c.paired for c in judged)
    geomeans = "head/base of the geometric means of the round medians"
    turns = "head/base of the passes timed in turn, both sides in each lifetime"
    if not judged:
        how = f"{geomeans}, [{confidence} interval]"
    elif paired == len(judged):
        how = f"{turns}, [{confidence} paired interval over the lifetimes]"
    elif paired:
        how = (
            f"{turns} for the {paired} cases measured in shared lifetimes [{confidence} paired interval], "
            f"else {geomeans} [{confidence} Welch interval]"
        )
    else:
        how = f"{geomeans}, [{confidence} Welch interval]"
    return (
        f"{how}; "
        f"better/worse: the whole interval past x{comparison.factor:g} (or 1/{comparison.factor:g}); ~: "
        f"within 1/{comparison.factor:g} .. x{comparison.factor:g}; too noisy: neither; detects: the "
        "smallest head/base the case's data could call worse (its inverse: better); "
        "ratio < 1: head faster"
    )


def render_table(comparison: Comparison, labels: tuple[str, str], console: Console) -> None:
    single = len({c.key.split("/")[0] for c in comparison.cases}) <= 1
    table = TableData(
        title=f"base {labels[0]}  vs  head {labels[1]}",
        headers=COLUMNS,
        rows=[_cells(c, single) for c in comparison.cases],
        numeric={i for i, align in enumerate(ALIGN) if align == "right"},
        verdict_column=COLUMNS.index("verdict"),
        verdict_styles=VERDICT_STYLES,
    )
    print_tables([table], console)  # fitted to the width, in column groups where it is too wide
    console.print(escape(comparison.summary()))
    for note in _notes(comparison, single):
        if note.startswith("compared anyway"):
            print_warning(note)
        else:
            console.print(escape(note), style="yellow" if note.startswith("not comparable") else "dim")
    console.print(escape(_rule(comparison)), style="dim")


def render_markdown(comparison: Comparison, labels: tuple[str, str]) -> str:
    """A PR comment: who is compared with what, the table, the summary, the notes."""
    single = len({c.key.split("/")[0] for c in comparison.cases}) <= 1
    e = comparison.head.environment
    parts = [
        f"**bench compare**: base `{labels[0]}` vs head `{labels[1]}` on {e.device_type} ({e.device_name}, "
        f"{e.backend}), {e.hostname}",
        markdown_table(
            DocTable(columns=COLUMNS, rows=[_cells(c, single) for c in comparison.cases], align=ALIGN)
        ),
        f"**{markdown_text(comparison.summary())}**",
    ]
    notes = [*_notes(comparison, single), _rule(comparison)]
    parts.append("\n".join(f"- {markdown_text(n)}" for n in notes))
    return "\n\n".join(parts) + "\n"


def comparison_json(comparison: Comparison, labels: tuple[str, str]) -> dict[str, Any]:
    """The comparison as data for CI bots and dashboards: both sides, the rule, and per case its verdict,
    head/base with its interval, the smallest change it could have detected, and both sides' measurements
    (bench export's columns: estimate and interval, rounds, contended rounds, peak bytes, ...)."""
    return {
        "base": labels[0],
        "head": labels[1],
        "factor": comparison.factor,
        "alpha": comparison.alpha,
        "interleaved": comparison.interleaved,
        "summary": comparison.summary(),
        "counts": {v: comparison.count(v) for v in get_args(Verdict)},
        "cases": [
            {
                "key": c.key,
                "verdict": c.verdict,
                "judged": c.verdict in JUDGED_VERDICTS,
                "ratio": c.ratio,
                "low": c.low,
                "high": c.high,
                "p_value": c.p_value,
                "detectable": c.detectable,
                "rounds": list(c.rounds),
                "paired": c.paired,
                "contended_rounds": list(c.contended_rounds),
                "memory_delta_bytes": None
                if c.base.memory is None or c.head.memory is None
                else c.head.memory.peak_bytes - c.base.memory.peak_bytes,
                "not_comparable": c.not_comparable,
                "forced": c.forced,
                "base": measure_cells(c.base),  # bench export's measurement columns
                "head": measure_cells(c.head),
            }
            for c in comparison.cases
        ],
        "not_compared": [dataclasses.asdict(n) for n in comparison.not_compared],
    }


# ----------------------------------------------------------------------------------------------------------


def check_thresholds(factor: float, alpha: float) -> None:
    """UserError, naming the flag, for a verdict factor or confidence that cannot work (compare, gate)."""
    if factor <= 1.0:
        raise UserError(f"--factor {factor}: must be > 1, e.g. --factor 1.10 for 10%")
    if not 0.0 < alpha < 1.0:
        raise UserError(f"--alpha {alpha}: must be between 0 and 1, e.g. --alpha 0.05")


def run(
    base: str,
    head: str,
    scenarios: Sequence[str] = (),
    *,
    sets: Sequence[str] = (),
    filters: Sequence[str] = (),
    device: str | None = None,
    config: str | None = None,
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
    force: bool = False,
    fmt: str = "table",
    fail_on_regression: bool = False,
    save_dir: str | None = None,
    console: Console | None = None,
    runner: interleave.Runner = interleave.run_on_side,
    budget_s: float | None = None,
    paired: bool = True,
) -> int:
    """Compare BASE and HEAD (files or refs); returns the exit code (see the module docstring).

    Args:
        base, head: result files, or git refs of the repository around the working directory
        scenarios, sets, filters, device, config: what to run on refs, as for `bench run`; `filters` also
            narrows the cases of two result files
        factor, alpha: the verdict's thresholds (bench.results.comparison)
        force: compare cases that are not comparable, with a warning
        fmt: "table" (rich), "markdown" (printed as is, for a PR comment) or "json" (comparison_json)
        fail_on_regression: return 3 when a case is worse or failed on head only
        save_dir: with refs, the folder of both sides' result files
        runner: runs one round on one side, unpaired (bench.launch.interleave.run_on_side); a test hook
        budget_s: with two refs, add rounds to the undecided cases until each is decided or this many
            seconds have passed (sequential verdicts: bench.results.comparison.sequential_alpha)
        paired: two refs measured paired (bench.launch.paired); False: each with its own bench
    """
    console = console or default_console
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: unknown format; use one of {', '.join(FORMATS)}")
    check_thresholds(factor, alpha)
    sides = (resolve_side(base, Path.cwd()), resolve_side(head, Path.cwd()))
    # In markdown and json mode the progress goes to stderr, so that stdout is the comment (data) alone.
    progress_console = console if fmt == "table" else Console(stderr=True, highlight=False)
    try:
        paths, spent = side_paths(
            sides,
            scenarios,
            sets=sets,
            filters=filters,
            device=device,
            config=config,
            save_dir=save_dir,
            console=progress_console,
            runner=runner,
            budget_s=budget_s,
            factor=factor,
            alpha=alpha,
            paired=paired,
        )
    except KeyboardInterrupt:
        return 130
    case_filter = parse_filters(filters)
    base_run, head_run = (_narrow(load_result(p), case_filter) for p in paths)
    judged_at = alpha if spent is None else spent  # with --budget: every look's alpha (sequential_alpha)
    comparison = compare_runs(base_run, head_run, factor=factor, alpha=judged_at, force=force)
    labels = (_side_label(sides[0], base_run), _side_label(sides[1], head_run))
    if fmt in ("markdown", "json"):
        text = (
            render_markdown(comparison, labels)
            if fmt == "markdown"
            else json.dumps(comparison_json(comparison, labels), indent=1) + "\n"
        )
        if console is default_console:
            sys.stdout.write(text)
        else:
            console.print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        render_table(comparison, labels, console)
    regressed = comparison.count("worse") > 0 or bool(comparison.head_failures)
    if not fail_on_regression:
        return 0
    if regressed:
        return EXIT_REGRESSION
    _require_compared(comparison, paths[1], filtered=bool(filters))
    if not any(c.verdict in JUDGED_VERDICTS for c in comparison.cases):
        states = ", ".join(f"{comparison.count(v)} {v}" for v in ("too noisy", "contended", "not comparable"))
        print_error(
            f"--fail-on-regression: no case got a verdict ({states}), so the gate cannot pass: rerun on an "
            "idle machine, or with more rounds (--set rounds=N)"
        )
        return EXIT_NO_VERDICT
    return 0


def _require_compared(comparison: Comparison, head: Path, *, filtered: bool) -> None:
    """--fail-on-regression: UserError when no case got a verdict (head has no cases, none is ok on both
    sides, or none is comparable), so that a gate that checked nothing does not pass."""
    if any(c.verdict != "not comparable" for c in comparison.cases):
        return
    narrowed = " after --filter" if filtered else ""
    if not comparison.head.cases:
        why = f"head ({display(head)}) has no cases{narrowed}"
    elif not comparison.cases:
        why = f"no case is ok on both sides{narrowed} (see the notes above)"
    else:
        why = "no case is comparable (see the notes above; --force compares them anyway)"
    raise UserError(
        f"--fail-on-regression: nothing was compared ({why}), so the gate cannot pass; give results that "
        "share ok cases"
    )
