"""What the commands that launch cases (run, verify, profile) share: the choice of cases they are given
(`CaseChoice`), the session set up from it once (`Session`: suite, selected cases, platform, torchrun job,
this process's console, the launcher), and the result file a run writes."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from bench.errors import UserError
from bench.launch.launcher import (
    LocalLauncher,
    RankFn,
    TorchrunEnv,
    TorchrunLauncher,
    leads,
    prepare_launch,
    torchrun_env,
)
from bench.results.env import Environment, collect_environment
from bench.results.store import ResultWriter, RunResult, result_filename
from bench.suite.config import Case
from bench.suite.filters import parse_filters
from bench.suite.loader import Suite, display, load_suite, parse_overrides
from bench.suite.selection import Selection, require_cases, run_device, select
from gdn_cp.distributed import Platform, resolve_platform


@dataclass(frozen=True, slots=True)
class CaseChoice:
    """What a command that launches cases is told to run, as its flags say it: the scenarios (names or .yaml
    paths; none: the suite's default), `--set key=value`, `--filter`, `--device` and `--config`."""

    scenarios: Sequence[str] = ()
    sets: Sequence[str] = ()
    filters: Sequence[str] = ()
    device: str | None = None
    config: str | None = None

    def argv(self, verb: str, extra: Sequence[str] = ()) -> list[str]:
        """The `bench VERB` command line of this choice, the command's own flags (`extra`) last."""
        return command_argv(
            verb,
            self.scenarios,
            sets=self.sets,
            filters=self.filters,
            device=self.device,
            config=self.config,
            extra=extra,
        )


@dataclass(frozen=True, slots=True)
class Session:
    """A command's cases, set up once before any rank starts (`open`): the suite (bench.yaml with the --set
    overrides), the selected cases, the platform they run on, the torchrun job (None: local ranks) and the
    console of this process (silent on a torchrun follower: rank 0 prints)."""

    choice: CaseChoice
    suite: Suite
    selections: list[Selection]
    platform: Platform
    job: TorchrunEnv | None
    console: Console

    @classmethod
    def open(
        cls,
        choice: CaseChoice,
        console: Console,
        cases: Callable[[list[Selection]], list[Selection]] | None = None,
    ) -> Session:
        """Load the suite and select the cases; `cases` turns the selections into the command's own (verify's
        forward+backward cases, profile's one case), raising UserError for what it cannot use. UserError
        when --filter leaves no case."""
        overrides = parse_overrides(choice.sets, choice.device)
        suite = load_suite(choice.config, overrides)
        selections = select(suite, choice.scenarios, overrides, parse_filters(choice.filters))
        if cases is not None:
            selections = cases(selections)
        require_cases(selections, choice.filters)
        platform = resolve_platform(run_device(suite.config.device, selections))
        job = torchrun_env()
        return cls(choice, suite, selections, platform, job, console_for(job, console))

    @property
    def leader(self) -> bool:
        """This process prints and writes the result file (every local run; rank 0 of a torchrun job)."""
        return leads(self.job)

    @property
    def cases(self) -> list[Case]:
        return [c for s in self.selections for c in s.cases]

    @property
    def name(self) -> str:
        """The run's name: its scenarios, joined by +."""
        return "+".join(s.scenario.name for s in self.selections)

    def launcher(self, rank_fn: RankFn, *, timed: bool = True) -> LocalLauncher | TorchrunLauncher:
        """The launcher of the cases, once every case has passed the checks against this host (preflight);
        `timed`: the command times them (bench verify does not)."""
        return prepare_launch(self.platform, self.job, self.suite, self.selections, rank_fn, timed=timed)

    def environment(self) -> Environment:
        """This machine's environment for a run of the cases (what its result file records)."""
        return collect_environment(
            self.platform,
            threads_per_rank=self.suite.config.threads_per_rank,
            world_sizes=[c.cp for c in self.cases],
            launcher="local" if self.job is None else "torchrun",
            local_rank=None if self.job is None else self.job.local_rank,
        )

    def new_run(self, name: str, command: Sequence[str] | None = None) -> RunResult:
        """An empty run of the cases, with this machine's environment (the header of its file)."""
        return RunResult(
            name=name,
            environment=self.environment(),
            suite=self.suite.config,
            scenarios={s.scenario.name: s.scenario.to_dict() for s in self.selections},
            command=None if command is None else list(command),
        )

    def result_writer(
        self,
        output: str | None,
        name: str,
        *,
        resumable: bool = False,
        command: Sequence[str] | None = None,
    ) -> ResultWriter | None:
        """The leader's new result file for the cases (None elsewhere: the leader writes), with the command
        line that ran them (`command`, see command_argv): `output`, else
        <results_dir>/<date>-<branch>-<commit>-<name>.json (-2, -3, ... when taken). An existing `output`, or
        a path that cannot be written, is a UserError (`resumable`: the command has --resume to suggest)."""
        if not self.leader:
            return None
        run = self.new_run(name, command)
        env = run.environment
        if output:
            _check_new_output(output, resumable)
            path = Path(output)
            where, fix = f"--output {output}", "give another --output"
        else:
            path = self.suite.results_dir / result_filename(
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


def console_for(job: TorchrunEnv | None, console: Console) -> Console:
    """`console` for the process that prints (every local run, rank 0 of a torchrun job), else a silent
    one."""
    return console if leads(job) else Console(quiet=True)
