"""`bench run [SCENARIO ...]`: time every case of the scenarios on its ranks and write one result file.

Every case runs `rounds` times (bench.launch.schedule): each round is every case once, in a seeded shuffled
order, the cases of one CP degree in one pool of `cp` local ranks (bench.launch.pool), so a case's rounds
are separate lifetimes of its ranks; under torchrun, the job's ranks run the cases whose cp is the job's
world size. Results are written after every case and round (bench.results.store), so an interrupted run
keeps what finished and `--resume FILE` continues it; one run at a time on a file (bench.results.lock: a
second says who holds it). Exit code: 0 when every case ran, 2 when some failed, 1 for a user error (bad
scenario, flag or file, a file another run is writing) or a result that could not be saved, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import os
import shlex
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec

from rich.console import Console
from rich.markup import escape

from bench.commands import commits, common_args
from bench.commands.session import CaseChoice, Session
from bench.console import CaseProgress, print_error, print_path, print_warning
from bench.console import console as default_console
from bench.errors import UserError
from bench.formats import case_line, format_seconds
from bench.launch.launcher import LocalLauncher, RankFn, TorchrunEnv, TorchrunLauncher, warn_oversubscription
from bench.launch.schedule import Slot, new_seed, rounds_wanted, slot_work, slots_left, work_left
from bench.launch.sweep import run_rounds
from bench.measure.contention import Window, busy, probe
from bench.measure.rank import measure_on_rank
from bench.render.run_tables import render
from bench.results.env import Environment
from bench.results.lock import ResultLock
from bench.results.names import resolve_result
from bench.results.paths import new_folder
from bench.results.store import (
    SESSION_ENV,
    CaseResult,
    ResultWriteError,
    ResultWriter,
    RunResult,
    is_verification_run,
)
from bench.suite.config import Case
from bench.suite.loader import display
from bench.suite.selection import Selection

NAME = "run"
P = ParamSpec("P")
HELP = "Run scenarios: time each case on its ranks (rank-max), measure peak memory, write a result file."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_args.add_scenarios(parser, "scenario names or .yaml paths (none: the suite's default_scenario)")
    common_args.add_device(parser)
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="result file, which must not exist (default: <results_dir>/<date>-<branch>-<commit>-<scenarios>"
        ".json, -2, -3, ... added when taken; results_dir is runs/, which git ignores)",
    )
    parser.add_argument(
        "--resume",
        metavar="FILE",
        help="continue the run in FILE (or latest: the newest in results_dir): skip its ok cases, append the "
        "rest to it (same scenarios and --set, same commit, dirty state, threads and machine)",
    )
    parser.add_argument(
        "--stop-after-round",
        metavar="K",
        type=int,
        help="stop once every case has K rounds (of its `rounds`); --resume continues. `bench compare` "
        "interleaves two refs this way, round by round",
    )
    parser.add_argument(
        "--no-plots",
        action="store_true",
        help="draw no charts at the end (by default the run's charts go to a new folder beside its result "
        "file, <file>-charts/; never plots/)",
    )
    parser.add_argument(
        "--require-idle",
        action="store_true",
        help="refuse to start on a busy machine (others taking over 20%% of the CPU, or steal over 5%%, in "
        "an idle moment before the first case): its timings would be contended; without it, a warning",
    )
    parser.add_argument(
        "--commits",
        action="append",
        default=[],
        metavar="RANGE",
        help="backfill: run the cases on each commit of A..B (first parents, oldest first) or on a ref, in a "
        "temporary worktree with its own code, one result file per commit under --history-dir; resumable, a "
        "commit that fails is recorded and the range goes on; repeatable",
    )
    parser.add_argument(
        "--machine",
        metavar="NAME",
        help="with --commits: the folder under --history-dir that keeps this machine's runs (default: the "
        "host name)",
    )
    parser.add_argument(
        "--history-dir",
        metavar="DIR",
        help="with --commits: where the per-commit files go (default: <results_dir>/history)",
    )
    common_args.add_config(parser)
    common_args.add_backend_modules(parser)


def main(args: argparse.Namespace) -> int:
    if args.commits:
        if args.output or args.resume or args.stop_after_round:
            raise UserError(
                "--commits writes one file per commit under --history-dir and resumes them itself; drop "
                "--output, --resume and --stop-after-round"
            )
        return commits.run_commits(
            CaseChoice(args.scenarios, args.sets, args.filters, args.device, args.config),
            args.commits,
            machine=args.machine,
            history_dir=args.history_dir,
        )
    if args.machine or args.history_dir:
        raise UserError("--machine and --history-dir go with --commits (a backfill); add --commits A..B")
    return run(
        args.scenarios,
        sets=args.sets,
        filters=args.filters,
        device=args.device,
        output=args.output,
        resume=args.resume,
        config=args.config,
        stop_after_round=args.stop_after_round,
        require_idle=args.require_idle,
        plots=not args.no_plots,
    )


RESUME_KEYS = (
    *("git_commit", "git_branch", "git_dirty", "threads_per_rank", "launcher", "device_type", "backend"),
    *("torch_version", "torch_npu_version", "python_version"),
)
"""Environment fields a resumed run must share with its file, whose header names them for every case."""
RESUME_HOST_KEYS = ("hostname", "cpu_model", "cpu_count", "device_name")
"""... and, for local runs (one host; under torchrun each rank's host differs), the machine's."""


def _shown(key: str, value: object) -> str:
    """An environment value in a message (commits shortened)."""
    return repr(value[:8]) if key == "git_commit" and isinstance(value, str) else repr(value)


def _open_resumed(
    path: str, selections: Sequence[Selection], env: Environment, job: TorchrunEnv | None
) -> ResultWriter:
    """The file to continue, once it is a `bench run` file of this code, machine and scenarios."""
    writer = ResultWriter.resume(path)
    stored = writer.run
    fresh = "or start a new run without --resume"
    if is_verification_run(stored):
        raise UserError(
            f"{path}: holds `bench verify` records, not `bench run` timings; resume a file that `bench run` "
            "wrote, or start a new run without --resume"
        )
    keys = RESUME_KEYS + (RESUME_HOST_KEYS if job is None else ())
    before, now = stored.environment, env
    changed = [
        f"{k} {_shown(k, getattr(before, k))} -> {_shown(k, getattr(now, k))}"
        for k in keys
        if getattr(before, k) != getattr(now, k)
    ]
    if changed:
        device = " (--device)" if before.device_type != now.device_type else ""
        raise UserError(
            f"{path}: was run with another environment than this run's ({', '.join(changed)}), which its "
            f"header records for every case; resume it where it ran{device}, {fresh}"
        )
    stored.environment.world_sizes = sorted(set(before.world_sizes) | set(now.world_sizes))
    for sel in selections:
        definition = sel.scenario.to_dict()
        before = stored.scenarios.get(sel.scenario.name)
        if before is not None and before != definition:
            changed = sorted(
                k for k in definition.keys() | before.keys() if definition.get(k) != before.get(k)
            )
            raise UserError(
                f"{path}: scenario {sel.scenario.name} differs from the one this file ran "
                f"({', '.join(changed)}); resume with the same scenario file and --set flags, {fresh}"
            )
        stored.scenarios[sel.scenario.name] = definition
    return writer


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What a `bench run` did: its exit code (see the module docstring) and its results."""

    exit_code: int
    run: RunResult
    """The run's record: the result file's contents (in memory only on a torchrun rank other than 0, whose
    leader writes the file)."""
    path: Path | None
    """The result file; None on a torchrun rank other than 0."""


def _exit_code_of(fn: Callable[P, RunOutcome]) -> Callable[P, int]:
    """`fn` (execute) returning the outcome's exit code."""

    @functools.wraps(fn)
    def exit_code(*args: P.args, **kwargs: P.kwargs) -> int:
        return fn(*args, **kwargs).exit_code

    return exit_code


def execute(
    scenarios: Sequence[str] = (),
    *,
    sets: Sequence[str] = (),
    filters: Sequence[str] = (),
    device: str | None = None,
    output: str | None = None,
    resume: str | None = None,
    config: str | None = None,
    stop_after_round: int | None = None,
    require_idle: bool = False,
    plots: bool = False,
    rank_fn: RankFn = measure_on_rank,
    console: Console | None = None,
) -> RunOutcome:
    """Run the scenarios' cases and write their results: the one code path of `bench run` and bench.api.run.

    Args:
        scenarios: names in the suite's scenarios folder or .yaml paths; none: the suite's default_scenario
        sets: `key=value` overrides (values as YAML) of suite or scenario keys
        filters: --filter expressions (bench.suite.filters)
        device: auto, cpu, cuda or npu; overrides the suite and the scenarios
        output: result file; default <results_dir>/<date>-<branch>-<commit>-<scenarios>.json
        resume: an earlier result file: its ok cases are skipped, the others run and are written to it
        config: bench.yaml path; default ./bench.yaml
        stop_after_round: stop once every case has this many rounds (a later --resume continues)
        require_idle: refuse (UserError) when the machine is busy before the first case; else a warning
        plots: draw the run's charts at the end into a new folder beside the result file (`bench run` does
            unless --no-plots; not a run stopped after a round, which is one side of `bench compare`)
        rank_fn: what each rank runs (bench.measure.rank.measure_on_rank); a test hook to inject failures
        console: where progress and tables go (default: the terminal)
    """
    _check_flags(output, resume, stop_after_round)
    resume = None if resume is None else resolve_result(resume, config=config)  # `--resume latest`
    choice = CaseChoice(scenarios, sets, filters, device, config)
    session = Session.open(choice, console or default_console)
    cases, leader, console = session.cases, session.leader, session.console
    launcher = session.launcher(rank_fn)
    start = _start(session, choice, output, resume)  # a bad --output or --resume is said first
    # one run at a time on the file (bench.results.lock), released however the run ends
    with start.lock or contextlib.nullcontext():
        writer = start.writer
        # the leader's idle moment (a follower's sweep measures its own)
        opening = _idle_check(require_idle=require_idle, fresh=None if resume else writer) if leader else None
        # a torchrun follower keeps its record in memory: the leader writes the file
        record = writer.run if writer is not None else session.new_run(session.name, start.command)
        path = None if writer is None else writer.path
        record.session = record.session or os.environ.get(SESSION_ENV) or None
        if leader:
            _announce(session, start, stop_after_round)
            warn_oversubscription(cases, launcher)
        try:
            results = _run_with_progress(cases, launcher, record, console, start, stop_after_round, opening)
        except (KeyboardInterrupt, ResultWriteError) as exc:
            return RunOutcome(exit_code=_stopped(exc, writer, choice, console), run=record, path=path)
        if writer is None:
            record.cases = list(results)
        else:
            console.print()
            render(writer.run, console)
            where = f" (on {socket.gethostname()}, rank 0)" if session.job is not None else ""
            print_path(console, "results", str(display(writer.path)), where.strip())
            if plots and stop_after_round is None:
                _draw_charts(writer, console)
        # A torchrun follower exits 0 once the job is done: the leader's code is the job's (a follower
        # exiting 2 first would make torchrun stop the leader while it still prints).
        code = 2 if leader and any(r.status == "failed" for r in results) else 0
        return RunOutcome(exit_code=code, run=record, path=path)


def _draw_charts(writer: ResultWriter, console: Console) -> None:
    """The run's charts (bench.render.charts, as `bench plot FILE` draws them) in a new folder the result
    file names, `<stem>-charts/` beside it (-2, ... when taken; never the committed plots/), and one line
    saying where; none when no chart fits the cases (`bench plot FILE` says why). A folder that cannot be
    written is a warning: the results are saved."""
    # Imported here: matplotlib takes a while to load, and a run that stops early or draws nothing needs none
    from bench.render.charts import build_charts, sources_for

    charts, _ = build_charts(sources_for([writer.run]))
    path = display(writer.path)
    if not charts:
        console.print(f"[dim]no chart fits these cases (`bench plot {escape(path)}` says why)[/]")
        return
    try:
        folder = new_folder(writer.path.with_name(f"{writer.path.stem}-charts"))
        for chart in charts:
            chart.save(folder)
    except OSError as exc:
        print_warning(f"the charts could not be written ({exc.strerror}); `bench plot {path}` draws them")
        return
    print_path(console, "charts", display(folder), f"({len(charts)}, e.g. {charts[0].name}.png)")


def _idle_check(*, require_idle: bool, fresh: ResultWriter | None) -> Window | None:
    """The idle moment before the first case (what the sweep judges its first cases with): a warning when
    the machine is busy, a UserError with `require_idle` (the new, empty result file `fresh` removed)."""
    window = probe()
    reason = busy(window)
    if reason is not None:
        if require_idle:
            if fresh is not None and fresh.saved == 0:
                fresh.path.unlink(missing_ok=True)  # nothing measured: no file of an empty run is left
            raise UserError(
                f"--require-idle: the machine is busy ({reason}); stop the other work, or run later "
                "(`bench doctor` watches the load)"
            )
        print_warning(
            f"busy machine: {reason}; cases timed now will be marked contended (--require-idle refuses to "
            "start)"
        )
    return window


def _announce(session: Session, start: _Start, stop_after: int | None) -> None:
    """The opening line: how many cases and case-rounds run, on what, and where the results go."""
    done = {c.key: len(c.rounds) for c in start.previous}
    left = slots_left(session.cases, done, stop_after)
    most = max((rounds_wanted(c, stop_after) for c in session.cases), default=0)
    where = "" if start.writer is None else f"; results in {escape(display(start.writer.path))}"
    platform = session.platform
    session.console.print(
        f"running {len(session.cases)} cases x up to {most} rounds ({left} case-rounds) of "
        f"{escape(session.name)} on {platform.device_type} ({platform.backend}){where}"
    )


def _check_flags(output: str | None, resume: str | None, stop_after_round: int | None) -> None:
    """UserError for flags that cannot go together, before anything is loaded."""
    if output and resume:
        raise UserError(
            "--output and --resume given together; --resume FILE writes to FILE, so drop --output"
        )
    if stop_after_round is not None and stop_after_round < 1:
        raise UserError(f"--stop-after-round {stop_after_round}: must be >= 1 (the rounds each case gets)")


@dataclass(frozen=True, slots=True)
class _Start:
    """Where a run begins: the cases already measured (a resume), the schedule's seed, the leader's result
    file (None on a torchrun follower) and the command line a new file records."""

    previous: list[CaseResult]
    seed: int
    writer: ResultWriter | None
    command: list[str] | None = None
    lock: ResultLock | None = None
    """The leader's lock on its result file, held for the whole run."""


def _start(session: Session, choice: CaseChoice, output: str | None, resume: str | None) -> _Start:
    """A new result file, or the resumed one with what it holds (its command line stays the one it began
    with); a torchrun follower opens none (the leader reads the file and shares its skips and seed)."""
    cases, console = session.cases, session.console
    if resume and not session.leader:
        return _Start([], new_seed(), None)
    if resume:
        # locked before it is read: a second run on the file stops here, naming the first (a missing
        # file is said by the reading)
        again = resume_command(choice, resume)
        lock = ResultLock.acquire(resume, again, note=print_warning) if Path(resume).is_file() else None
        try:
            opened = _open_resumed(resume, session.selections, session.environment(), session.job)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        previous = [c for c in opened.run.cases if c.status == "ok"]
        seed = opened.run.schedule_seed if opened.run.schedule_seed is not None else new_seed()
        complete = sum(len(c.rounds) >= c.case.rounds for c in previous)
        rounds_done = sum(len(c.rounds) for c in previous)
        console.print(
            f"resuming {escape(display(Path(resume)))}: {complete} of {len(cases)} cases done, "
            f"{rounds_done} of {sum(c.rounds for c in cases)} case-rounds"
        )
        return _Start(previous, seed, opened, lock=lock)
    command = choice.argv(NAME, ["--output", output] if output else [])
    writer = session.result_writer(output, session.name, resumable=True, command=command)
    if writer is None:  # a torchrun follower: the leader writes the file, and locks it
        return _Start([], new_seed(), None, command)
    # a new file is locked once made (a resume of it in between holds the lock instead: this run stops)
    lock = ResultLock.acquire(writer.path, shlex.join(command), note=print_warning)
    return _Start([], new_seed(), writer, command, lock)


def _stopped(
    exc: KeyboardInterrupt | ResultWriteError,
    writer: ResultWriter | None,
    choice: CaseChoice,
    console: Console,
) -> int:
    """The exit code of a run stopped by Ctrl-C (130) or by a result that could not be saved (1), after
    saying where the finished cases are and how to continue."""
    if isinstance(exc, KeyboardInterrupt):
        if writer is not None:
            again = resume_command(choice, display(writer.path))
            console.print(
                f"[yellow]interrupted[/]: {escape(kept_summary(writer.run, display(writer.path)))}; "
                f"continue with `{escape(again)}`"
            )
        return 130
    assert writer is not None  # only a writer writes
    again = resume_command(choice, display(writer.path))
    read_only = exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    fix = "make its folder writable again" if read_only else "free space or fix the folder"
    print_error(
        f"{exc.strerror}: the run stopped; {display(writer.path)} holds the {writer.saved} case "
        f"result{'' if writer.saved == 1 else 's'} saved before (the file is whole; the case that could "
        f"not be saved runs again): {fix}, then continue with `{again}`"
    )
    return 1


def kept_summary(run: RunResult, path: str) -> str:
    """What an interrupted run's file keeps, for the line that says how to continue it: its finished cases
    and the rounds of those partly measured (a resume runs only the rounds still missing), or nothing."""
    ok = [c for c in run.cases if c.status == "ok" and c.rounds]
    finished = sum(len(c.rounds) >= c.case.rounds for c in ok)
    partial = [c for c in ok if len(c.rounds) < c.case.rounds]
    parts = [f"{finished} finished case{'s' * (finished != 1)}"] if finished else []
    if partial:
        rounds = sum(len(c.rounds) for c in partial)
        parts.append(
            f"{rounds} round{'s' * (rounds != 1)} of {len(partial)} partly measured case"
            f"{'s' * (len(partial) != 1)}"
        )
    others = len(run.cases) - len(ok)
    if others:
        parts.append(f"{others} failed or skipped case{'s' * (others != 1)}")
    if not parts:
        return f"{path} holds no measurement yet (no case-round finished)"
    return f"{path} keeps {', '.join(parts)}"


run = _exit_code_of(execute)
"""`execute` returning its exit code alone (what the CLI exits with): the same arguments, declared once."""


def resume_command(choice: CaseChoice, path: str) -> str:
    """The `bench run` command line that continues this run in `path`: the same scenario words, --set,
    --filter, --device and --config (a resume checks that the scenarios are the same), quoted for a shell."""
    return shlex.join(choice.argv(NAME, ["--resume", path]))


def _run_with_progress(
    cases: Sequence[Case],
    launcher: LocalLauncher | TorchrunLauncher,
    record: RunResult,
    console: Console,
    start: _Start,
    stop_after: int | None,
    opening: Window | None = None,
) -> list[CaseResult]:
    """Run the cases' rounds under a progress bar, one status line per finished case and round, from
    `start` (its writer, seed and the cases already measured); `opening`: the idle moment measured before
    the first case."""
    writer, seed, previous = start.writer, start.seed, start.previous
    # the bar's count: the leader's view (a follower's console prints nothing)
    done = {c.key: len(c.rounds) for c in previous}
    total, work = slots_left(cases, done, stop_after), work_left(cases, done, stop_after)
    with launcher.group(), CaseProgress(console, total, work, unit="case-rounds") as progress:
        # the leader's (a torchrun job's rank 0, the one that read the file): every rank runs one schedule
        seed, previous = launcher.agree((seed, list(previous)))
        record.schedule_seed = seed  # a writer saves it with the first result
        record.environment.nodes = launcher.nodes  # a torchrun job's nodes, agreed on joining
        if writer is not None and launcher.nodes is not None:
            console.print(f"writing {escape(str(writer.path.resolve()))} on {socket.gethostname()} (rank 0)")

        # off a terminal each line starts with [i/N] (CaseProgress): the line fits beside it
        width = console.width - (0 if console.is_terminal else len(f"[{total}/{total}] "))

        def line(slot: Slot, result: CaseResult) -> str:
            # the case's time so far is its estimate (case_line); this round's own median follows, named
            extra = []
            if result.status == "ok" and len(result.rounds) > 1:
                extra = [f"[dim]this round {format_seconds(result.rounds[-1].median_s)}[/]"]
            prefix = f"r{slot.round + 1}/{rounds_wanted(slot.case, stop_after)} "
            return case_line(result, width, prefix, extra)

        return run_rounds(
            cases,
            launcher,
            writer,
            seed=seed,
            previous=previous,
            stop_after=stop_after,
            on_start=lambda slot: progress.start(f"{slot.case.key()} round {slot.round + 1}"),
            on_done=lambda slot, result: progress.done(line(slot, result), slot_work(slot.case)),
            opening=opening,
        )
