"""What the commands that launch cases (run, verify, profile) share around their launches: the result file
a run writes, and the console of a process that is not the one printing (a torchrun follower)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from bench.errors import UserError
from bench.launch.launcher import TorchrunEnv, leads
from bench.results.env import Environment, collect_environment
from bench.results.store import ResultWriter, RunResult, result_filename
from bench.suite.loader import Suite, display
from bench.suite.selection import Selection
from gdn_cp.distributed import Platform


def run_environment(
    suite: Suite, selections: Sequence[Selection], platform: Platform, job: TorchrunEnv | None
) -> Environment:
    """This machine's environment for a run of the selections' cases (what its result file records)."""
    return collect_environment(
        platform,
        threads_per_rank=suite.config.threads_per_rank,
        world_sizes=[c.cp for s in selections for c in s.cases],
        launcher="local" if job is None else "torchrun",
        local_rank=None if job is None else job.local_rank,
    )


def _check_new_output(output: str, resumable: bool) -> None:
    """UserError when --output names a folder or an existing file (result files are never overwritten).
    Only the process that writes checks: under torchrun the other ranks would race with its new file (and
    torchrun stops them when it exits)."""
    path = Path(output)
    if path.is_dir():
        example = path / "result.json"
        raise UserError(f"--output {output}: is a folder; give a file name, e.g. --output {example}")
    if path.exists():
        raise _exists_error(output, resumable)


def _exists_error(output: str, resumable: bool) -> UserError:
    """--output names an existing file."""
    resume = f"continue that run with --resume {output}, or " if resumable else ""
    return UserError(
        f"--output {output}: the file exists, and result files are never overwritten; {resume}give another "
        "name"
    )


def command_argv(
    verb: str,
    scenarios: Sequence[str],
    *,
    sets: Sequence[str] = (),
    filters: Sequence[str] = (),
    device: str | None = None,
    config: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The `bench VERB` command line of a run, as argv: the scenario words, --set, --filter, --device,
    --config, then `extra` (the command's own flags). What a result file records (RunResult.command), and
    what `bench run` prints to continue an interrupted run; the same whether the run came from the command
    line or from Python (bench.api)."""
    argv = ["bench", verb, *scenarios]
    for flag, values in (("--set", sets), ("--filter", filters)):
        for value in values:
            argv += [flag, value]
    if device is not None:
        argv += ["--device", device]
    if config is not None:
        argv += ["--config", config]
    return [*argv, *extra]


def new_run(
    name: str,
    suite: Suite,
    selections: Sequence[Selection],
    platform: Platform,
    job: TorchrunEnv | None,
    command: Sequence[str] | None = None,
) -> RunResult:
    """An empty run of the selections' cases, with this machine's environment (the header of its file)."""
    return RunResult(
        name=name,
        environment=run_environment(suite, selections, platform, job),
        suite=suite.config.to_dict(),
        scenarios={s.scenario.name: s.scenario.to_dict() for s in selections},
        command=None if command is None else list(command),
    )


def new_result_writer(
    output: str | None,
    name: str,
    suite: Suite,
    selections: Sequence[Selection],
    platform: Platform,
    job: TorchrunEnv | None,
    *,
    resumable: bool = False,
    command: Sequence[str] | None = None,
) -> ResultWriter:
    """A new result file for the selections' cases, with this machine's environment and the command line
    that ran them (`command`, see command_argv): `output`, else
    <results_dir>/<date>-<branch>-<commit>-<name>.json (-2, -3, ... when taken). An existing `output`, or
    a path that cannot be written, is a UserError (`resumable`: the command has --resume to suggest)."""
    run = new_run(name, suite, selections, platform, job, command)
    env = run.environment
    if output:
        _check_new_output(output, resumable)
        path = Path(output)
        where, fix = f"--output {output}", "give another --output"
    else:
        path = suite.results_dir / result_filename(
            datetime.datetime.now(), env.git_branch, env.git_commit, name
        )
        where, fix = display(path), "set results_dir in bench.yaml, or give --output FILE"
    try:
        return ResultWriter(path, run, numbered=not output)
    except OSError as exc:
        if output and isinstance(exc, FileExistsError) and path.exists():  # created since the check
            raise _exists_error(output, resumable) from None
        reason = (
            "a folder above it is a file"
            if isinstance(exc, FileExistsError | NotADirectoryError)
            else exc.strerror
        )
        raise UserError(f"{where}: cannot write a result file there ({reason}); {fix}") from None


def console_for(job: TorchrunEnv | None, console: Console) -> Console:
    """`console` for the process that prints (every local run, rank 0 of a torchrun job), else a silent
    one."""
    return console if leads(job) else Console(quiet=True)
