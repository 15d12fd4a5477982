"""Run the same cases on two checkouts in one session, alternating case by case (`bench compare REF REF`).

Order: base case 1, head case 1, base case 2, head case 2, ... so that drift on a noisy machine (another
job starting, thermal throttling) hits both sides alike instead of all of one side.

Each side runs its *own* code: every case is one `python -m bench run SCENARIO.yaml --filter case_id=ID`
subprocess with the working directory and PYTHONPATH set to that side's worktree, writing (then resuming)
that side's result file. What both sides run is one definition: the scenario files and the suite file are
copied once, from the current working tree, into a staging folder that both subprocesses read; `--set`
and `--device` are passed to both. After every case the side's file must record the side's commit, which
proves that the worktree's code ran and not an installed copy of bench.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.errors import UserError
from bench.launch.gitrefs import RefSide
from bench.results.store import CaseResult, load_result
from bench.suite.config import Case
from bench.suite.loader import Suite
from bench.suite.selection import Selection


@dataclass(frozen=True, slots=True)
class Checkout:
    """One side of an A/B run."""

    name: str
    """base or head."""
    side: RefSide
    root: Path
    """Its worktree."""
    output: Path
    """Its result file."""


@dataclass(frozen=True, slots=True)
class Planned:
    """A case to run on every side, and the staged scenario file it comes from."""

    scenario_file: Path
    case: Case


@dataclass(frozen=True, slots=True)
class Staged:
    """The definitions both sides run."""

    config: Path
    """The staged suite file (passed as --config)."""
    plan: list[Planned]


def stage(selections: Sequence[Selection], suite: Suite, folder: Path) -> Staged:
    """Copy the scenario files and the suite file into `folder`; the plan: every selected case in order.

    A scenario keeps its file name (its name is the file's stem, which case keys include). Without a
    bench.yaml the staged suite file is empty: the defaults of the code that reads it, rather than the
    worktree's own bench.yaml, which could differ between the refs.
    """
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "bench.yaml"
    if suite.path is not None:
        shutil.copyfile(suite.path, config)
    else:
        config.write_text("# no bench.yaml in the working tree: the suite defaults\n")
    plan = []
    for sel in selections:
        staged = folder / "scenarios" / f"{sel.scenario.name}.yaml"
        staged.parent.mkdir(exist_ok=True)
        shutil.copyfile(sel.path, staged)
        plan += [Planned(scenario_file=staged, case=case) for case in sel.cases]
    # A record of what ran, for whoever finds the folder (it is removed after the run).
    (folder / "plan.yaml").write_text(yaml.safe_dump([p.case.key() for p in plan]))
    return Staged(config=config, plan=plan)


def bench_run_argv(
    planned: Planned,
    output: Path,
    *,
    resume: bool,
    config: Path,
    sets: Sequence[str] = (),
    device: str | None = None,
) -> list[str]:
    """The `bench run` command line of one case on one side: --output the first time, --resume after."""
    argv = [sys.executable, "-m", "bench", "run", str(planned.scenario_file), "--config", str(config)]
    argv += ["--filter", f"case_id={planned.case.case_id}"]
    argv += ["--resume" if resume else "--output", str(output)]
    for item in sets:
        argv += ["--set", item]
    if device is not None:
        argv += ["--device", device]
    return argv


def side_env(root: Path) -> dict[str, str]:
    """This process's environment with PYTHONPATH = the worktree alone, so its bench and gdn_cp import
    first (an editable install's finder comes after PYTHONPATH on sys.path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)
    return env


def _last_error(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "no error message"
    return lines[-1].removeprefix("error: ")


def run_on_side(
    checkout: Checkout,
    planned: Planned,
    *,
    resume: bool,
    config: Path,
    sets: Sequence[str] = (),
    device: str | None = None,
) -> CaseResult:
    """Run one case with the side's own bench; its CaseResult as the side's file records it.

    Exit 0 (ok) and 2 (the case failed) both leave the case in the file; 130 is Ctrl-C; anything else
    means this ref's bench cannot run the staged definitions: a UserError naming the ref.
    """
    argv = bench_run_argv(planned, checkout.output, resume=resume, config=config, sets=sets, device=device)
    proc = subprocess.run(
        argv, cwd=checkout.root, env=side_env(checkout.root), capture_output=True, text=True
    )
    who = f"{checkout.name} {checkout.side.label}"
    if proc.returncode == 130:
        raise KeyboardInterrupt
    if proc.returncode not in (0, 2):
        raise UserError(
            f"{who}: its bench cannot run {planned.case.key()} (exit {proc.returncode}: "
            f"{_last_error(proc.stderr or proc.stdout)}); the ref may predate `bench run` or this "
            "scenario's keys; compare result files instead (`bench run` on each ref, then "
            "`bench compare A.json B.json`)"
        )
    run = load_result(checkout.output)
    if run.environment.git_commit != checkout.side.commit:
        raise UserError(
            f"{who}: the run recorded commit {run.environment.git_commit[:8]}, not "
            f"{checkout.side.commit[:8]}: another copy of bench ran instead of the worktree's; check "
            "PYTHONPATH and the installed packages"
        )
    result = run.get(planned.case.key())
    if result is None:
        raise UserError(
            f"{who}: `bench run` exited {proc.returncode} but {checkout.output} has no {planned.case.key()}; "
            "its case ids differ from this bench's, so compare result files instead"
        )
    return result


Runner = Callable[..., CaseResult]


def run_alternating(
    checkouts: Sequence[Checkout],
    staged: Staged,
    *,
    sets: Sequence[str] = (),
    device: str | None = None,
    runner: Runner = run_on_side,
    on_start: Callable[[Checkout, Planned], None] = lambda checkout, planned: None,
    on_done: Callable[[Checkout, CaseResult], None] = lambda checkout, result: None,
) -> None:
    """Every planned case on every checkout, alternating: case 1 on each side, then case 2, ..."""
    started: set[str] = set()
    for planned in staged.plan:
        for checkout in checkouts:
            on_start(checkout, planned)
            result = runner(
                checkout,
                planned,
                resume=checkout.name in started,
                config=staged.config,
                sets=sets,
                device=device,
            )
            started.add(checkout.name)
            on_done(checkout, result)
