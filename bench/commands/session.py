"""What the commands that launch or compare cases (run, verify, profile, compare, gate, the --commits
backfill) share: the choice of cases they are given (`CaseChoice`, turned into cases by `choose`, with the
one "no case left" message), the session set up from it once (`Session`: suite, selected cases, platform,
torchrun job, this process's console, the launcher), and the result file a run writes."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from bench.errors import UserError
from bench.launch import interleave, user_backends
from bench.launch.devices import host_device_name
from bench.launch.gitrefs import FileSide, Side
from bench.launch.launcher import (
    LocalLauncher,
    RankFn,
    TorchrunEnv,
    TorchrunLauncher,
    leads,
    prepare_launch,
    torchrun_env,
)
from bench.launch.ref_rounds import Budget, SidePaths, measure_refs
from bench.results.env import Environment, collect_environment
from bench.results.outputs import RESULT_FILE, check_output_file, check_output_folder, protected_kind
from bench.results.paths import new_folder, result_filename
from bench.results.store import ResultWriter, RunResult, load_result
from bench.suite.config import Case
from bench.suite.filters import CaseFilter, parse_filters
from bench.suite.loader import Override, Suite, display, load_suite, parse_overrides
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
    filter_flag: str = "--filter"
    """The flag `filters` came from, for messages (profile's --case)."""

    def choose(
        self,
        narrow: Callable[[list[Selection]], list[Selection]] | None = None,
        *,
        narrowed_by: str | None = None,
    ) -> Chosen:
        """The suite (bench.yaml with the --set overrides) and the selected cases; `narrow` turns the
        selections into the command's own (verify's forward+backward cases, profile's one case, compare's
        cases of a result file; `narrowed_by` says what it did, for the message), raising UserError for what
        it cannot use. UserError when no case is left (bench.suite.selection.require_cases)."""
        user_backends.load()  # BENCH_BACKENDS (--backend-module: bench.cli), before a scenario is read
        overrides = parse_overrides(self.sets, self.device)
        suite = self.suite()
        selections = select(suite, self.scenarios, overrides, parse_filters(self.filters))
        if narrow is not None:
            selections = narrow(selections)
        require_cases(selections, self.filters, flag=self.filter_flag, narrowed_by=narrowed_by)
        return Chosen(suite, selections, overrides)

    def suite(self) -> Suite:
        """bench.yaml (`config`, else the one found from here) with the --set and --device overrides of its
        keys: what `choose` selects from."""
        return load_suite(self.config, parse_overrides(self.sets, self.device))

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
class Chosen:
    """The cases a CaseChoice names: the suite they come from and the selection of each scenario."""

    suite: Suite
    selections: list[Selection]
    overrides: list[Override]
    """The --set and --device overrides as parsed (a command may add to them, as compare does rounds)."""

    @property
    def cases(self) -> list[Case]:
        return [c for s in self.selections for c in s.cases]

    @property
    def name(self) -> str:
        """A run's name: its scenarios with cases, joined by +."""
        return "+".join(s.scenario.name for s in self.selections if s.cases)


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
        """The cases of `choice` (CaseChoice.choose, `cases` narrowing them), on the platform they run on."""
        chosen = choice.choose(cases)
        suite, selections = chosen.suite, chosen.selections
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
            device_name=host_device_name(self.platform, None if self.job is None else self.job.local_rank),
            threads_per_rank=self.suite.config.threads_per_rank,
            world_sizes=[c.cp for c in self.cases],
            launcher="local" if self.job is None else "torchrun",
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
    resume = resumable and protected_kind(path) == RESULT_FILE
    again = f"continue that run with --resume {output}, or " if resume else ""
    check_output_file(path, flag="--output", suffixes=(".json",), hint=f"{again}give another name")
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
    --config, the --backend-module flags this process was given (bench.launch.user_backends), then `extra`
    (the command's own flags). What a result file records (RunResult.command), and
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
    for module in user_backends.flagged():
        argv += ["--backend-module", module]
    return [*argv, *extra]


def console_for(job: TorchrunEnv | None, console: Console) -> Console:
    """`console` for the process that prints (every local run, rank 0 of a torchrun job), else a silent
    one."""
    return console if leads(job) else Console(quiet=True)


def compared_files(
    sides: Sequence[Side],
    choice: CaseChoice,
    *,
    command: str,
    save_dir: str | None,
    console: Console,
    budget: Budget | None = None,
    paired: bool = True,
    runner: interleave.Runner = interleave.run_on_side,
) -> SidePaths:
    """Both sides' result files, base then head, for `bench compare` and `bench gate`: two files as they
    are; with a ref, the chosen cases run on it (bench.launch.ref_rounds), their files in `save_dir`, else
    <results_dir>/<command>-<date>-<time>. UserError for run options given with two files, or a budget with
    a file side."""
    if all(isinstance(s, FileSide) for s in sides):
        if choice.scenarios or choice.sets or choice.device or budget is not None:
            raise UserError(
                "scenarios, --set, --device and --budget choose what to run, but two result files run "
                "nothing; drop them (--filter narrows the files' cases), or give git refs to run"
            )
        return SidePaths([s.path for s in sides if isinstance(s, FileSide)])
    if budget is not None and any(isinstance(s, FileSide) for s in sides):
        raise UserError("--budget adds rounds to both sides, so both must be git refs, not a result file")
    choice, chosen = _choice_for_refs(sides, choice)
    now = datetime.datetime.now()
    folder = (
        check_output_folder(save_dir, flag="--save-dir", hint="give a folder for both sides' result files")
        if save_dir
        else new_folder(chosen.suite.results_dir / f"{command}-{now:%Y%m%d-%H%M%S}")
    )
    return measure_refs(
        sides,
        chosen.suite,
        chosen.selections,
        folder,
        sets=choice.sets,
        device=choice.device,
        console=console,
        runner=runner,
        budget=budget,
        paired=paired,
    )


def _choice_for_refs(sides: Sequence[Side], choice: CaseChoice) -> tuple[CaseChoice, Chosen]:
    """What runs on the refs: against a result file, the file's scenarios (unless named) and only the cases
    it can be compared on; two refs, every case at least the suite's compare_rounds (unless --set rounds
    says otherwise), which both ways of running refs take as `--set rounds=N`."""
    file_run = next((load_result(s.path) for s in sides if isinstance(s, FileSide)), None)
    if file_run is not None:
        if not choice.scenarios:
            choice = dataclasses.replace(choice, scenarios=list(file_run.scenarios))
        keys = {c.key for c in file_run.cases}

        def in_file(selections: list[Selection]) -> list[Selection]:
            return [dataclasses.replace(s, cases=[c for c in s.cases if c.key() in keys]) for s in selections]

        return choice, choice.choose(in_file, narrowed_by="the result file's cases")
    chosen = choice.choose()
    wanted = chosen.suite.config.compare_rounds
    if min(c.rounds for c in chosen.cases) < wanted and all(o.key != "rounds" for o in chosen.overrides):
        most = max(c.rounds for c in chosen.cases)
        choice = dataclasses.replace(choice, sets=[*choice.sets, f"rounds={max(most, wanted)}"])
        chosen = choice.choose()
    return choice, chosen


def narrowed(run: RunResult, case_filter: CaseFilter) -> RunResult:
    """`run` with only the cases --filter keeps."""
    return dataclasses.replace(run, cases=[c for c in run.cases if case_filter.matches(c.case)])
