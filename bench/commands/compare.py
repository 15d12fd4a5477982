"""`bench compare BASE HEAD [SCENARIO ...]`: is head faster or slower than base, case by case?

BASE and HEAD are each a result file (when the path exists) or a git ref. Two files are compared as they
are. A ref is checked out in a temporary worktree and the scenarios of the current working tree run on it
(identical for both sides); both sides' result files are kept (<results_dir>/compare-<date>/, or --save-dir)
so that they can be compared again later. Two refs are measured paired (bench.launch.paired): each round of
a case is one lifetime of the ranks in which base's and head's gdn_cp both run, pass by pass in turn,
measured by this checkout's bench, so that what a lifetime shares cancels in the ratio. `--unpaired` runs
each ref's own bench instead (a change to bench itself), base and head round by round in turn
(bench.launch.interleave). A ref against a file runs only the ref, with its own bench, on the file's cases.

Per case ok on both sides (bench.judge.comparison): the ratio head/base of the round-level estimates
with its (1 - alpha) confidence interval (paired, or Welch's between unpaired rounds), a verdict (better /
worse only when the whole interval lies past --factor, ~ when it lies within 1/factor .. factor, else too
noisy), the smallest change the data could detect, and the peak-memory delta. Rounds of two
refs run in one session, so drift on the machine spreads over both; two files measured at different times
are compared too, with a note that drift between them is not controlled. Cases from different machines,
devices, torch versions or scenario definitions are "not comparable" unless --force; so are cases whose two
sides compute different outputs (their correctness gate's fingerprints differ beyond its bar,
bench.measure.gate) unless --allow-different-outputs, and cases a ref's gdn_cp cannot run as named (a
backend, layout or option it does not take: skipped on both sides, saying what it lacks).

Exit code: 0; 1 for a user error, or with --fail-on-regression when nothing was compared (head has no cases,
or no case is ok and comparable on both sides); 3 with --fail-on-regression when a case is worse, or ok on
base but failed on head; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from bench.commands import common_args
from bench.commands.common_args import EXIT_NO_VERDICT, EXIT_REGRESSION
from bench.commands.session import CaseChoice, compared_files, narrowed
from bench.console import console as default_console
from bench.console import print_error
from bench.errors import UserError
from bench.judge.comparison import DEFAULT_ALPHA, DEFAULT_FACTOR, JUDGED_VERDICTS, Comparison, compare_runs
from bench.launch import interleave
from bench.launch.gitrefs import resolve_side
from bench.launch.ref_rounds import Budget
from bench.render.comparison import FORMATS, comparison_json, render_markdown, render_table, side_label
from bench.results.names import resolve_result
from bench.results.store import load_result
from bench.suite.filters import parse_filters
from bench.suite.loader import display

NAME = "compare"
HELP = (
    "Compare two result files or git refs case by case (head/base with a 95% interval from rounds, verdict, "
    "peak memory). Exit 3 with --fail-on-regression when a case got worse."
)


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
    parser.add_argument(
        "base",
        metavar="BASE",
        help="result file (latest, latest~1, ...: the newest runs in results_dir), or git ref (branch, tag, "
        "commit) to run",
    )
    parser.add_argument("head", metavar="HEAD", help="result file (or latest, ...), or git ref to run")
    common_args.add_scenarios(
        parser,
        "with a ref: scenario names or .yaml paths to run on both sides (default: the suite's "
        "default_scenario; against a result file: that file's scenarios); --filter also narrows two files",
    )
    common_args.add_device(parser)
    common_args.add_config(parser)
    common_args.add_backend_modules(parser)
    common_args.add_compare(parser, NAME)
    parser.add_argument(
        "--force",
        action="store_true",
        help="compare cases that are not comparable (other machine, device, torch, scenario), with a warning",
    )
    parser.add_argument(
        "--allow-different-outputs",
        action="store_true",
        help="compare cases whose two sides' outputs differ beyond the gate's bar (bench.measure.gate), "
        "e.g. a change of the math under test; they are not comparable without it",
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
        "--fail-on-regression",
        action="store_true",
        help=f"exit {EXIT_REGRESSION} when any case is worse, or ok on base but failed on head (CI gates)",
    )


def main(args: argparse.Namespace) -> int:
    return run(
        args.base,
        args.head,
        CaseChoice(args.scenarios, args.sets, args.filters, args.device, args.config),
        factor=args.factor,
        alpha=args.alpha,
        force=args.force,
        allow_different_outputs=args.allow_different_outputs,
        fmt=args.fmt,
        budget_s=args.budget,
        fail_on_regression=args.fail_on_regression,
        save_dir=args.save_dir,
        paired=not args.unpaired,
    )


def run(
    base: str,
    head: str,
    choice: CaseChoice | None = None,
    *,
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
    force: bool = False,
    allow_different_outputs: bool = False,
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
        choice: what to run on refs, as for `bench run`; its --filter also narrows two result files
        factor, alpha: the verdict's thresholds (bench.judge.comparison)
        force: compare cases that are not comparable, with a warning
        allow_different_outputs: compare cases whose two sides compute different outputs (the one check
            --force would also lift, alone)
        fmt: "table" (rich), "markdown" (printed as is, for a PR comment) or "json" (comparison_json)
        fail_on_regression: return 3 when a case is worse or failed on head only
        save_dir: with refs, the folder of both sides' result files
        runner: runs one round on one side, unpaired (bench.launch.interleave.run_on_side); a test hook
        budget_s: with two refs, add rounds to the undecided cases until each is decided or this many
            seconds have passed (sequential verdicts: bench.judge.comparison.sequential_alpha)
        paired: two refs measured paired (bench.launch.paired); False: each with its own bench
    """
    console = console or default_console
    choice = choice or CaseChoice()
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: unknown format; use one of {', '.join(FORMATS)}")
    common_args.check_thresholds(factor, alpha)
    base, head = (resolve_result(side, config=choice.config) for side in (base, head))
    sides = (resolve_side(base, Path.cwd()), resolve_side(head, Path.cwd()))
    # In markdown and json mode the progress goes to stderr, so that stdout is the comment (data) alone.
    progress_console = console if fmt == "table" else Console(stderr=True, highlight=False)
    budget = None if budget_s is None else Budget(budget_s, factor, alpha)
    try:
        paths, spent = compared_files(
            sides,
            choice,
            command=NAME,
            save_dir=save_dir,
            console=progress_console,
            budget=budget,
            paired=paired,
            runner=runner,
        )
    except KeyboardInterrupt:
        return 130
    case_filter = parse_filters(choice.filters)
    base_run, head_run = (narrowed(load_result(p), case_filter) for p in paths)
    judged_at = alpha if spent is None else spent  # with --budget: every look's alpha (sequential_alpha)
    comparison = compare_runs(
        base_run,
        head_run,
        factor=factor,
        alpha=judged_at,
        force=force,
        allow_different_outputs=allow_different_outputs,
    )
    labels = (side_label(sides[0], base_run), side_label(sides[1], head_run))
    _print(comparison, labels, fmt, console)
    if not fail_on_regression:
        return 0
    return _gate_code(comparison, paths[1], filtered=bool(choice.filters))


def _print(comparison: Comparison, labels: tuple[str, str], fmt: str, console: Console) -> None:
    """The comparison in `fmt`: markdown and json as plain text on stdout, the table through rich."""
    if fmt == "table":
        render_table(comparison, labels, console)
        return
    text = (
        render_markdown(comparison, labels)
        if fmt == "markdown"
        else json.dumps(comparison_json(comparison, labels), indent=1) + "\n"
    )
    if console is default_console:
        sys.stdout.write(text)
    else:
        console.print(text, markup=False, highlight=False, soft_wrap=True)


def _gate_code(comparison: Comparison, head: Path, *, filtered: bool) -> int:
    """--fail-on-regression's exit code: EXIT_REGRESSION when a case is worse or failed on head only,
    EXIT_NO_VERDICT when no case got a verdict, else 0; UserError when nothing was compared."""
    if comparison.count("worse") > 0 or comparison.head_failures:
        return EXIT_REGRESSION
    _require_compared(comparison, head, filtered=filtered)
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
