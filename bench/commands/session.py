"""What the commands that launch cases (run, verify, profile) share around their launches: the result file
a run writes, and the console of a process that is not the one printing (a torchrun follower)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from bench.launch.launcher import TorchrunEnv, leads
from bench.results.env import collect_environment
from bench.results.store import ResultWriter, RunResult, result_filename
from bench.suite.loader import Suite
from bench.suite.selection import Selection
from gdn_cp.distributed import Platform


def new_result_writer(
    output: str | None,
    name: str,
    suite: Suite,
    selections: Sequence[Selection],
    platform: Platform,
    job: TorchrunEnv | None,
) -> ResultWriter:
    """A new result file for the selections' cases, with this machine's environment: `output`, else
    <results_dir>/<date>-<branch>-<commit>-<name>.json."""
    env = collect_environment(
        platform,
        threads_per_rank=suite.config.threads_per_rank,
        world_sizes=[c.cp for s in selections for c in s.cases],
        launcher="local" if job is None else "torchrun",
    )
    if output:
        path = Path(output)
    else:
        path = suite.results_dir / result_filename(
            datetime.datetime.now(), env.git_branch, env.git_commit, name
        )
    run = RunResult(
        name=name,
        environment=env,
        suite=suite.config.to_dict(),
        scenarios={s.scenario.name: s.scenario.to_dict() for s in selections},
    )
    return ResultWriter(path, run)


def console_for(job: TorchrunEnv | None, console: Console) -> Console:
    """`console` for the process that prints (every local run, rank 0 of a torchrun job), else a silent
    one."""
    return console if leads(job) else Console(quiet=True)
