"""Run the same cases on two checkouts in one session, round by round in turn (`bench compare REF REF`).

Order: base round 1 (every case, in its shuffled order, in pools of its own), head round 1, base round 2,
head round 2, ... so that drift on a noisy machine (another job starting, thermal throttling) hits both
sides alike instead of all of one side, and each side's rounds are separate lifetimes of its ranks.

Each side runs its *own* code: every round of a side is one `python -m bench run SCENARIO.yaml ...
--filter scenario=S,case_id=ID ... --stop-after-round K` subprocess with the working directory and
PYTHONPATH set to that side's worktree, writing (then resuming) that side's result file. What both sides
run is one definition: the scenario files and the suite file are copied once, from the current working
tree, into a staging folder that both subprocesses read; `--set` and `--device` are passed to both. Both
record one session id (BENCH_SESSION), which tells `bench compare` that their drift is shared. After every
round the side's file must record the side's commit, which proves that the worktree's code ran and not an
installed copy of bench. A ref whose bench predates rounds cannot run this way: compare result files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.errors import UserError
from bench.launch import user_backends
from bench.launch.gitrefs import RefSide
from bench.results.env import REF_ENV
from bench.results.store import SESSION_ENV, RunResult, load_result
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
    session: str = field(default_factory=lambda: uuid.uuid4().hex)
    """The session id both sides record (RunResult.session)."""

    @property
    def scenario_files(self) -> list[Path]:
        return list(dict.fromkeys(p.scenario_file for p in self.plan))

    @property
    def rounds(self) -> int:
        """The most rounds a planned case has: how many turns each side takes."""
        return max((p.case.rounds for p in self.plan), default=0)


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
    staged: Staged,
    output: Path,
    *,
    resume: bool,
    stop_after: int,
    sets: Sequence[str] = (),
    device: str | None = None,
) -> list[str]:
    """The `bench run` command line of one side's round `stop_after`: every staged scenario, the planned
    cases (one --filter each), --output the first time, --resume after."""
    argv = [
        sys.executable,
        "-m",
        "bench",
        "run",
        *map(str, staged.scenario_files),
        "--config",
        str(staged.config),
    ]
    for planned in staged.plan:
        argv += ["--filter", f"scenario={planned.case.scenario},case_id={planned.case.case_id}"]
    argv += ["--resume" if resume else "--output", str(output)]
    argv += ["--stop-after-round", str(stop_after)]
    for item in sets:
        argv += ["--set", item]
    if device is not None:
        argv += ["--device", device]
    return argv


def side_env(root: Path, session: str, ref: str) -> dict[str, str]:
    """This process's environment with PYTHONPATH = the worktree, so its bench and gdn_cp import first (an
    editable install's finder comes after PYTHONPATH on sys.path), then the folders of the user's backend
    modules, which BENCH_BACKENDS names (bench.launch.user_backends: the side's bench imports them as this
    one did), the ref it was checked out from (REF_ENV: the branch its result records) and the session id
    ("": runs of their own, as a backfill's: none is set)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *user_backends.search_path()])
    modules = user_backends.imported_modules()
    env.pop(user_backends.BACKENDS_ENV, None)
    if modules:
        env[user_backends.BACKENDS_ENV] = ",".join(modules)
    env[REF_ENV] = ref
    env.pop(SESSION_ENV, None)
    if session:
        env[SESSION_ENV] = session
    return env


def _last_error(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "no error message"
    return lines[-1].removeprefix("error: ")


def run_on_side(
    checkout: Checkout,
    staged: Staged,
    *,
    resume: bool,
    stop_after: int,
    sets: Sequence[str] = (),
    device: str | None = None,
) -> RunResult:
    """Run round `stop_after` of every planned case with the side's own bench; the side's file after it.

    Exit 0 (ok) and 2 (a case failed) both leave the cases in the file; 130 is Ctrl-C; anything else
    means this ref's bench cannot run the staged definitions: a UserError naming the ref.
    """
    argv = bench_run_argv(
        staged, checkout.output, resume=resume, stop_after=stop_after, sets=sets, device=device
    )
    proc = subprocess.run(
        argv,
        cwd=checkout.root,
        env=side_env(checkout.root, staged.session, checkout.side.spec),
        capture_output=True,
        text=True,
    )
    who = f"{checkout.name} {checkout.side.label}"
    if proc.returncode == 130:
        raise KeyboardInterrupt
    if proc.returncode not in (0, 2):
        raise UserError(
            f"{who}: its bench cannot run round {stop_after} of the staged cases (exit {proc.returncode}: "
            f"{_last_error(proc.stderr or proc.stdout)}); the ref may predate `bench run`, rounds "
            "(--stop-after-round) or this scenario's keys; compare result files instead (`bench run` on "
            "each ref, then `bench compare A.json B.json`)"
        )
    run = load_result(checkout.output)
    if run.environment.git_commit != checkout.side.commit:
        raise UserError(
            f"{who}: the run recorded commit {run.environment.git_commit[:8]}, not "
            f"{checkout.side.commit[:8]}: another copy of bench ran instead of the worktree's; check "
            "PYTHONPATH and the installed packages"
        )
    missing = [p.case.key() for p in staged.plan if run.get(p.case.key()) is None]
    if missing:
        raise UserError(
            f"{who}: `bench run` exited {proc.returncode} but {checkout.output} has no {missing[0]}; "
            "its case ids differ from this bench's, so compare result files instead"
        )
    return run


Runner = Callable[..., RunResult]


def run_alternating(
    checkouts: Sequence[Checkout],
    staged: Staged,
    rounds: Sequence[int] | None = None,
    *,
    started: set[str] | None = None,
    sets: Sequence[str] = (),
    device: str | None = None,
    runner: Runner = run_on_side,
    on_start: Callable[[Checkout, int], None] = lambda checkout, round_: None,
    on_done: Callable[[Checkout, int, RunResult], None] = lambda checkout, round_, run: None,
) -> None:
    """`rounds` (1-based; default 1 .. staged.rounds) on every checkout in turn: the first round on each side,
    then the next, ... `started`: the checkouts whose files exist (resumed, not created), updated."""
    started = set() if started is None else started
    for round_ in rounds if rounds is not None else range(1, staged.rounds + 1):
        for checkout in checkouts:
            on_start(checkout, round_)
            run = runner(
                checkout, staged, resume=checkout.name in started, stop_after=round_, sets=sets, device=device
            )
            started.add(checkout.name)
            on_done(checkout, round_, run)
