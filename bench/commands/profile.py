"""`bench profile SCENARIO --case FILTER`: where one case's step goes, on every rank.

Exactly one case of the scenario must match --case (the --filter syntax). Its `cp` ranks run one warmup
pass, one pass counting the bytes of every collective (beside the analytic model of
gdn_cp.distributed.comm_model), one pass under MemTracker (memory by kind), then --steps passes under
torch.profiler (bench/profiling/rank.py). Written under <results_dir>/profiles/<run>/: one Chrome trace per
rank (rank<r>.json: open it in https://ui.perfetto.dev or chrome://tracing) and summary.json (the tables as
data). Printed (bench.render.profile_tables): per rank the step split into compute, each collective kind and
waiting (definitions in bench/profiling/traces.py), the straggler and the phase behind it; the bytes each
rank sent and received per collective kind, counted and modelled; the memory breakdown per rank.

Exit code: 0; 3 when the counted bytes differ from the model (a bug in a collective or in the model);
2 when the case did not run; 1 for a user error.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from bench.commands import common_args
from bench.commands.session import CaseChoice, Session
from bench.console import console as default_console
from bench.console import print_path
from bench.errors import UserError
from bench.launch.launcher import TorchrunEnv
from bench.profiling import RankProfile, profile_on_rank
from bench.render.profile_tables import Profiled, print_profile, profile_summary
from bench.results.env import git_info
from bench.results.outputs import check_output_folder
from bench.results.paths import create_folder, profile_folder
from bench.suite.config import Case
from bench.suite.loader import display
from bench.suite.selection import Selection

NAME = "profile"
HELP = (
    "Profile one case on every rank: a Chrome trace per rank, time in compute / each collective / waiting, "
    "the straggler, bytes per collective against the model, memory by kind."
)

EXIT_MODEL_MISMATCH = 3
"""The bytes counted on the wire differ from the analytic model."""
PROFILE_FILES = ("summary.json", "rank*.json")
"""What a profile writes into its folder; an --output folder that holds any of them is refused."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", metavar="SCENARIO", help="a scenario name or .yaml path")
    parser.add_argument(
        "--case",
        required=True,
        metavar="FILTER",
        help="the one case to profile, in --filter syntax (e.g. mode=p2p,cp=2,checkpoint=true or a case id)",
    )
    parser.add_argument("--steps", type=int, default=3, metavar="N", help="profiled steps (default 3)")
    common_args.add_sets(parser)
    common_args.add_device(parser)
    parser.add_argument(
        "--output",
        metavar="DIR",
        help="folder of the traces, new or without a profile in it (default: a new "
        "<results_dir>/profiles/<date>-...-<case>/)",
    )
    common_args.add_config(parser)
    common_args.add_backend_modules(parser)


def main(args: argparse.Namespace) -> int:
    return run(
        args.scenario,
        case=args.case,
        steps=args.steps,
        sets=args.sets,
        device=args.device,
        output=args.output,
        config=args.config,
    )


def _one_case(cases: Sequence[Case], expr: str, scenario: str) -> Case:
    if len(cases) == 1:
        return cases[0]
    listed = ", ".join(c.case_id for c in cases[:8]) + (
        f", ... ({len(cases)} in all)" if len(cases) > 8 else ""
    )
    raise UserError(
        f"--case {expr} matches {len(cases)} cases of {scenario} ({listed}); narrow it to one, e.g. "
        f"--case {cases[0].case_id}"
    )


def _run_dir(output: str | None, results_dir: Path, case: Case, job: TorchrunEnv | None) -> Path:
    """--output (a new folder, or one without a profile in it; UserError for a file or a profile's
    folder), else a new folder under <results_dir>/profiles/ (bench.results.paths.profile_folder)."""
    if output:
        path = check_output_folder(output, flag="--output", hint="give a folder for the traces (a new one)")
        if path.is_dir() and any(next(path.glob(pattern), None) for pattern in PROFILE_FILES):
            raise UserError(
                f"--output {output}: already holds a profile (summary.json or rank<r>.json), which this one "
                "would overwrite; give a new folder"
            )
        return path
    git = git_info()
    run_id = None if job is None else os.environ.get("TORCHELASTIC_RUN_ID", "torchrun")
    return profile_folder(results_dir, case.key(), branch=git.branch, commit=git.commit, run_id=run_id)


def run(
    scenario: str,
    *,
    case: str,
    steps: int = 3,
    sets: Sequence[str] = (),
    device: str | None = None,
    output: str | None = None,
    config: str | None = None,
    console: Console | None = None,
) -> int:
    """Profile the one case of `scenario` that `case` (a --filter expression) matches; the exit code."""
    if steps < 1:
        raise UserError(f"--steps {steps}: give a positive number of steps, e.g. --steps 3")

    def one_case(found: list[Selection]) -> list[Selection]:
        (sel,) = found
        if not sel.cases:  # CaseChoice.choose says so, as every command does
            return found
        return [dataclasses.replace(sel, cases=[_one_case(sel.cases, case, sel.scenario.name)])]

    choice = CaseChoice([scenario], sets, [case], device, config, filter_flag="--case")
    session = Session.open(choice, console or default_console, one_case)
    (the_case,) = session.cases
    platform, job, console = session.platform, session.job, session.console
    run_dir = _run_dir(output, session.suite.results_dir, the_case, job)
    launcher = session.launcher(
        functools.partial(profile_on_rank, steps=steps, trace_dir=str(run_dir.resolve()))
    )
    create_folder(run_dir, claim=not output and job is None)  # once the case has passed the checks
    console.print(f"profiling {escape(the_case.key())} on {the_case.cp} ranks ({platform.device_type})")
    with launcher.group():
        outcome = launcher.run(the_case)
    if outcome.status != "ok":
        console.print(f"[red]{outcome.status}[/]: {escape(outcome.error or '')}")
        return 2
    profiles: list[RankProfile] = outcome.results
    found = Profiled.of(profiles, the_case, steps, platform.device_type)
    print_profile(found, console)
    if job is None or job.rank == 0:
        (run_dir / "summary.json").write_text(json.dumps(profile_summary(found), indent=1) + "\n")
        print_path(console, "traces", f"{display(run_dir)}/rank<r>.json", "(open in https://ui.perfetto.dev)")
    return 0 if found.bytes_match else EXIT_MODEL_MISMATCH
