"""`bench gate BASE HEAD --verify FILE`: may a change go in? Head must be faster or equal, and exact.

BASE and HEAD are `bench run` result files, or git refs: refs are run as `bench compare BASE HEAD` runs them
(paired in shared lifetimes of the ranks, or with --unpaired each ref's own bench; both result files kept
in --save-dir). `--verify` names head's `bench verify` result files (repeatable), `--base-verify` base's,
shown beside them. The timing verdicts come from bench.judge.comparison, the judgement from
bench.judge.gate: slower = a case "worse", or ok on base but failed on head; inexact = a head check above
its bar, or a head check that failed to run; any other timing state (not comparable, contended, ...) is no
verdict.

Exit codes (EXIT_CODES), for CI:
    0  pass: no case slower, every head check exact, and at least one timing judged and one check run
    1  bad input: a missing or unreadable file, a verify file given as a run or the reverse, a bad flag
    3  slower (as `bench compare --fail-on-regression`)
    4  inexact
    5  slower and inexact
    6  nothing compared: no timing got a verdict, or no head check ran (a gate that checked nothing fails)
  130  interrupted
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from bench.commands import common_args
from bench.commands.common_args import EXIT_NO_VERDICT, EXIT_REGRESSION
from bench.commands.session import CaseChoice, compared_files, narrowed
from bench.console import console as default_console
from bench.console import print_warning
from bench.errors import UserError
from bench.judge.analysis import source_label
from bench.judge.comparison import DEFAULT_ALPHA, DEFAULT_FACTOR, compare_runs, not_comparable_note
from bench.judge.gate import GateResult, Outcome, gate
from bench.launch.gitrefs import resolve_side
from bench.launch.ref_rounds import Budget
from bench.render.gate import accuracy_table, timing_table
from bench.render.tables import print_tables
from bench.results.names import resolve_result
from bench.results.store import RunResult, load_result
from bench.results.verifications import Verification
from bench.suite.filters import CaseFilter, parse_filters
from bench.suite.loader import display

NAME = "gate"
HELP = (
    "Gate a change: head must be faster or equal (bench compare's verdicts) and exact (bench verify's "
    "checks on head). Exit 0 pass, 3 slower, 4 inexact, 5 both, 6 nothing compared, 1 bad input."
)
EXIT_CODES: dict[Outcome, int] = {
    "pass": 0,
    "slower": EXIT_REGRESSION,
    "inexact": 4,
    "slower and inexact": 5,
    "nothing compared": EXIT_NO_VERDICT,
}
"""The exit code of each outcome (1 is a user error, as for every command; 130 an interrupt)."""
OUTCOME_STYLES: dict[Outcome, str] = {
    "pass": "bold green",
    "slower": "bold red",
    "inexact": "bold red",
    "slower and inexact": "bold red",
    "nothing compared": "bold yellow",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Exit codes: "
        + ", ".join(f"{code} {o}" for o, code in EXIT_CODES.items())
        + (", 1 bad input, 130 interrupted.")
    )
    parser.add_argument("base", metavar="BASE", help="`bench run` result file, or git ref to run")
    parser.add_argument("head", metavar="HEAD", help="`bench run` result file, or git ref to run")
    common_args.add_scenarios(
        parser,
        "with a ref: scenarios to run on both sides, as for `bench compare`; --filter also narrows files",
    )
    common_args.add_device(parser)
    common_args.add_config(parser)
    common_args.add_backend_modules(parser)
    parser.add_argument(
        "--verify",
        dest="verify",
        action="append",
        default=[],
        metavar="FILE",
        help="head's `bench verify` result file (repeatable); its checks decide exactness",
    )
    parser.add_argument(
        "--base-verify",
        dest="base_verify",
        action="append",
        default=[],
        metavar="FILE",
        help="base's `bench verify` result file (repeatable), shown beside head's",
    )
    common_args.add_compare(parser, NAME)


def main(args: argparse.Namespace) -> int:
    return run(
        args.base,
        args.head,
        CaseChoice(args.scenarios, args.sets, args.filters, args.device, args.config),
        verify=args.verify,
        base_verify=args.base_verify,
        factor=args.factor,
        alpha=args.alpha,
        save_dir=args.save_dir,
        budget_s=args.budget,
        paired=not args.unpaired,
    )


def _timing_run(path: Path) -> RunResult:
    """A `bench run` file; UserError for a verify file or one without cases."""
    run = load_result(path)
    if not run.cases:
        hint = (
            "it holds `bench verify` checks: give it with --verify"
            if run.verifications
            else "it has no cases"
        )
        raise UserError(
            f"{display(path)}: not a timing run ({hint}); give a `bench run` result file or a git ref"
        )
    return run


def _records(
    paths: Sequence[str], flag: str, case_filter: CaseFilter
) -> tuple[list[Verification], dict[str, str]]:
    """The checks of verify files, narrowed by --filter, and each file's commit; UserError for a file that
    holds none."""
    out: list[Verification] = []
    commits: dict[str, str] = {}
    for p in paths:
        run = load_result(p)
        if not run.verifications:
            what = "timing cases: give it as BASE or HEAD" if run.cases else "no checks"
            raise UserError(f"{flag} {p}: not a `bench verify` file ({what})")
        out += [r for r in run.verifications if case_filter.matches(r.case)]
        commits[p] = run.environment.git_commit
    return out, commits


def _warn_other_commits(flag: str, commits: dict[str, str], run: RunResult, side: str) -> None:
    """A warning per verify file whose commit is not the one its side's timings ran."""
    ran = run.environment.git_commit
    for path, commit in commits.items():
        if commit != ran:
            print_warning(
                f"{flag} {path}: its checks ran at commit {commit[:12]}, but {side}'s timings at {ran[:12]}: "
                f"the gate's exactness is then not {side}'s; verify at {ran[:12]} (bench verify ... at that "
                "commit)"
            )


def render(result: GateResult, labels: tuple[str, str], console: Console) -> None:
    """Both tables, then the outcome in one coloured line."""
    console.print(f"base {escape(labels[0])}  vs  head {escape(labels[1])}")
    print_tables([timing_table(result), accuracy_table(result)], console)
    for reason, n in result.comparison.not_comparable_reasons().items():  # what differs, and the flag
        console.print(escape(not_comparable_note(reason, n, command="bench compare")), style="yellow")
    style = OUTCOME_STYLES[result.outcome]
    outcome, rest = result.summary().split(";", 1)
    console.print(f"[{style}]gate: {escape(outcome)}[/];{escape(rest)} (exit {EXIT_CODES[result.outcome]})")


def run(
    base: str,
    head: str,
    choice: CaseChoice | None = None,
    *,
    verify: Sequence[str] = (),
    base_verify: Sequence[str] = (),
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
    save_dir: str | None = None,
    console: Console | None = None,
    budget_s: float | None = None,
    paired: bool = True,
) -> int:
    """Gate HEAD against BASE on timing and head's accuracy checks; returns the exit code (EXIT_CODES).
    `budget_s`: with two refs, compare's adaptive rounds (bench compare --budget), verdicts at its alpha."""
    console = console or default_console
    config = choice.config if choice is not None else None  # short names (latest, ...): bench.results.names
    base, head = (resolve_result(side, config=config) for side in (base, head))
    verify = [resolve_result(v, kind="verify", config=config) for v in verify]
    base_verify = [resolve_result(v, kind="verify", config=config) for v in base_verify]
    sides = (resolve_side(base, Path.cwd()), resolve_side(head, Path.cwd()))  # a missing file first
    if not verify:
        raise UserError(
            "give head's accuracy checks with --verify FILE (a result file of `bench verify`, e.g. "
            "`bench verify cpu-verify --output head-verify.json` at head): the gate needs exactness too"
        )
    common_args.check_thresholds(factor, alpha)
    choice = choice or CaseChoice()
    case_filter = parse_filters(choice.filters)
    head_records, head_commits = _records(verify, "--verify", case_filter)
    base_records, base_commits = _records(base_verify, "--base-verify", case_filter)
    budget = None if budget_s is None else Budget(budget_s, factor, alpha)
    try:  # the progress on stderr, so that stdout is the gate's table alone
        paths, spent = compared_files(
            sides,
            choice,
            command=NAME,
            save_dir=save_dir,
            console=Console(stderr=True, highlight=False),
            budget=budget,
            paired=paired,
        )
    except KeyboardInterrupt:
        return 130
    base_run, head_run = (_timing_run(p) for p in paths)
    _warn_other_commits("--verify", head_commits, head_run, "head")
    _warn_other_commits("--base-verify", base_commits, base_run, "base")
    base_run, head_run = (narrowed(r, case_filter) for r in (base_run, head_run))
    comparison = compare_runs(base_run, head_run, factor=factor, alpha=alpha if spent is None else spent)
    result = gate(comparison, base_records, head_records)
    labels = (f"{paths[0].name} ({source_label(base_run)})", f"{paths[1].name} ({source_label(head_run)})")
    render(result, labels, console)
    return EXIT_CODES[result.outcome]
