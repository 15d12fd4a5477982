"""Run cases on their ranks, in one of two ways:

- local (the default): a pool of `cp` processes on 127.0.0.1 (bench.launch.pool) runs many cases in one
  lifetime: `with launcher.pool(cp) as runner: runner.run(case)`; `launcher.run(case)` is a pool of one case
  (`bench verify`, `bench profile`). A crash, OOM or hang of one case cannot take down the sweep: it comes
  back as a RankFailure naming the root cause, the case is recorded as failed, and the pool restarts for the
  next case. Threads per rank are explicit (the suite's threads_per_rank, else cores // ranks), and the
  suite's timeout_s is both the collective timeout and each case's wall-clock limit.
- torchrun: when RANK and WORLD_SIZE are set, `bench run` is already one rank of a job (possibly multi-node).
  It joins the job's process group once, checks that every node runs the same code, torch and devices, and
  runs each case with cp up to the job's world size on global ranks 0 .. cp - 1, in a group of its own
  (bench.launch.job: a failing case fails alone). Only global rank 0 writes results.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from rich.markup import escape
from torch.distributed import ProcessGroup

from bench.console import console, print_warning
from bench.launch.devices import probe_devices
from bench.launch.job import (
    NCCL_ERROR_HANDLING,
    CaseRunner,
    JobStuck,
    agree_on_nodes,
    job_store,
    own_nccl_errors,
)
from bench.launch.local import default_threads_per_rank
from bench.launch.pool import RankPool
from bench.launch.preflight import check_cases
from bench.launch.user_backends import BackendOnlyInLauncher
from bench.measure.gate import CaseCheckError
from bench.measure.memory import PROFILER_PRELOAD
from bench.measure.rank import CaseRound, RankResults, measure_on_rank
from bench.results.env import NodeEnvironment, node_environment
from bench.results.store import Status
from bench.suite.config import Case
from bench.suite.loader import Suite
from bench.suite.selection import Selection
from gdn_cp.distributed import Platform, init_rank_group, teardown_process_group

RankFn = Callable[[Case, str], Any]
"""What each rank runs, given the case and the device kind: bench.measure.rank.measure_on_rank (returning
RankResults) for `bench run`, the verify and profile rank functions (bench.verification, bench.profiling);
tests pass a module-level function that fails on purpose. Rank 0's return value is the launch's result."""

T = TypeVar("T")

MAX_RANKS_PER_CORE = 4
"""A local cpu launch refuses more ranks than this many per core: they would only measure contention."""


@dataclass(frozen=True, slots=True)
class TorchrunEnv:
    """This process's place in a torchrun job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int = 0
    """This node's index in the job (torchrun's GROUP_RANK)."""


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """The torchrun job this process belongs to (RANK and WORLD_SIZE set), else None."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world = int(env["WORLD_SIZE"])
    return TorchrunEnv(
        rank=int(env["RANK"]),
        world_size=world,
        local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
        node=int(env.get("GROUP_RANK", "0")),
    )


def threads_per_rank(configured: int | None, ranks_on_host: int) -> int:
    """The suite's threads_per_rank, else cores // ranks on this host (at least 1)."""
    return configured or default_threads_per_rank(ranks_on_host)


def oversubscription_warning(ranks_on_host: int, threads: int) -> str | None:
    """A warning when the ranks' threads exceed this host's cores (timings then measure contention)."""
    cores = os.cpu_count() or 1
    if ranks_on_host * threads <= cores:
        return None
    threads_text = f"{threads} thread{'s' if threads > 1 else ''}"
    return (
        f"{ranks_on_host} ranks x {threads_text} exceed this host's {cores} cores; timings include "
        "contention (compare such cases only with each other)"
    )


@dataclass(kw_only=True, slots=True)
class Outcome:
    """What a launch returned: the measurements, or why there are none."""

    status: Status
    """ok, failed or skipped."""
    results: RankResults | Any = None
    """What rank 0's rank function returned (RankResults for `bench run`); None unless ok."""
    error: str | None = None
    wall_s: float = 0.0
    lifetime: str | None = None
    """The id of the ranks' lifetime it ran in (a local pool's); None under torchrun (the job's one)."""


GATE_FAILURE = re.compile(
    rf"^rank \d+ failed: (?:{CaseCheckError.__name__}|{BackendOnlyInLauncher.__name__}): "
)
"""How a rank's failure starts when the correctness gate failed the case (bench.measure.gate), or when the
ranks lack a backend the launcher registered (bench.launch.user_backends)."""


def failure_line(error: str) -> str:
    """A case's failure as recorded: the gate's own line where the gate failed it, the missing backend's where
    the ranks lack one the launcher has (every rank raised the same line: which rank was first says
    nothing), else the first failing rank and its error."""
    return GATE_FAILURE.sub("", error, count=1)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the block (main thread only), so that a terminated sweep stops
    like Ctrl-C: pools closed, finished cases kept, the resume command printed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


class PoolRunner:
    """Runs cases of one CP degree on one RankPool (restarted after a failed case)."""

    def __init__(self, pool: RankPool) -> None:
        self.pool = pool

    def run(self, case: Case | CaseRound) -> Outcome:
        answer = self.pool.run(case)
        if answer.failure is not None:
            return Outcome(status="failed", error=failure_line(str(answer.failure)), wall_s=answer.wall_s)
        return Outcome(status="ok", results=answer.value, wall_s=answer.wall_s, lifetime=answer.lifetime)


class LocalLauncher:
    """Pools of local ranks: one per CP degree and round (bench.launch.sweep), or one per case (`run`)."""

    def __init__(
        self,
        platform: Platform,
        *,
        threads_per_rank: int | None,
        timeout_s: float,
        rank_fn: RankFn = measure_on_rank,
    ) -> None:
        self.platform = platform
        self.threads_per_rank = threads_per_rank
        self.timeout_s = timeout_s
        self.rank_fn = rank_fn
        self.nodes: list[NodeEnvironment] | None = None
        """One host: its environment is the run's own."""

    def ranks_on_host(self, case: Case) -> int:
        return case.cp

    def group(self) -> contextlib.AbstractContextManager[None]:
        """No process group to join (every pool has its own); SIGTERM stops the sweep like Ctrl-C."""
        return sigterm_as_interrupt()

    def threads_for(self, case: Case) -> int:
        return threads_per_rank(self.threads_per_rank, case.cp)

    def agree(self, value: T) -> T:
        """What every process uses (the schedule seed, the resumed cases): this one's (one process)."""
        return value

    @contextlib.contextmanager
    def pool(self, cp: int) -> Iterator[PoolRunner]:
        """One lifetime of `cp` ranks (started by its first case, closed at the end of the block)."""
        pool = RankPool(
            cp,
            self.rank_fn,
            device=self.platform.device_type,
            threads=threads_per_rank(self.threads_per_rank, cp),
            timeout_s=self.timeout_s,
            preload=PROFILER_PRELOAD,  # bench run reads memory, bench profile profiles: with the profiler
        )
        with pool:
            yield PoolRunner(pool)

    def run(self, case: Case | CaseRound) -> Outcome:
        """One case in a pool of its own; the wall time includes starting the ranks."""
        start = time.perf_counter()
        with self.pool(case.cp) as runner:
            outcome = runner.run(case)
        outcome.wall_s = time.perf_counter() - start
        return outcome


class TorchrunLauncher:
    """Runs each case as this rank of the torchrun job (bench.launch.job): every case with cp up to the job's
    world size, in a group of its own over global ranks 0 .. cp - 1, its outcome shared through the job's
    store; the job's process group lives for the whole sweep."""

    def __init__(
        self,
        platform: Platform,
        job: TorchrunEnv,
        *,
        threads_per_rank: int | None,
        timeout_s: float,
        rank_fn: RankFn = measure_on_rank,
    ) -> None:
        self.platform = platform
        self.job = job
        self.threads_per_rank = threads_per_rank
        self.timeout_s = timeout_s
        self.rank_fn = rank_fn
        # A rank function that takes a group runs any cp <= world size; one that does not (verify, profile)
        # runs in the job's own group, so only at cp == world size.
        self.takes_group = "group" in inspect.signature(rank_fn).parameters
        self.nodes: list[NodeEnvironment] | None = None
        """Every node's environment (set in `group`)."""
        self._runner: CaseRunner | None = None
        self._stuck: str | None = None

    def ranks_on_host(self, case: Case) -> int:
        return self.job.local_world_size

    def threads_for(self, case: Case) -> int:
        return threads_per_rank(self.threads_per_rank, self.job.local_world_size)

    def agree(self, value: T) -> T:
        """Rank 0's `value` (the schedule seed, the resumed cases: rank 0 alone reads the result file), on
        every rank (inside `group`): all ranks must run one schedule."""
        chosen = [value]
        dist.broadcast_object_list(chosen, src=0)
        return chosen[0]

    @contextlib.contextmanager
    def pool(self, cp: int) -> Iterator[TorchrunLauncher]:
        """The job's process group is the one lifetime of its ranks: every case runs in it."""
        yield self

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Join the job's process group (its device set first, the platform's backend), agree on every
        node's environment, and open the job's store for the cases' outcomes."""
        torch.set_num_threads(threads_per_rank(self.threads_per_rank, self.job.local_world_size))
        timeout = datetime.timedelta(seconds=self.timeout_s)
        if self.platform.backend == "nccl":
            # 0, what torch documents for _abort_process_group (bench.launch.job), whatever torchrun set (1):
            # the job aborts a failed case's communicators itself, and the watchdog must not end the job
            replaced = own_nccl_errors()
            if replaced is not None and self.job.rank == 0:
                console.print(
                    f"note: {NCCL_ERROR_HANDLING} was {escape(replaced)} (torchrun sets 1 in every rank); "
                    "this job sets 0 in each rank: it aborts a failed or overrun case's process group itself "
                    "(bench.launch.job), where NCCL's watchdog would end the whole job",
                    soft_wrap=True,
                )
        init_rank_group(self.platform, timeout)
        try:
            local = node_environment(
                self.platform,
                node=self.job.node,
                ranks=self.job.local_world_size,
                device_name=self.platform.device_name(self.job.local_rank),
            )
            self.nodes = agree_on_nodes(local)
            self._runner = CaseRunner(
                backend=self.platform.backend,
                timeout_s=self.timeout_s,
                store=job_store(timeout),
                watch_store=job_store(timeout),
            )
            yield
        except BaseException:
            dist.destroy_process_group()  # no barrier: the other ranks may never get there
            raise
        teardown_process_group(timeout)

    def run(self, case: Case | CaseRound) -> Outcome:
        start = time.perf_counter()
        world = self.job.world_size
        most = world if self.takes_group else None
        if case.cp > world or (most is None and case.cp != world):
            needs = f"cp={case.cp} ranks" if case.cp > world else f"a job of exactly cp={case.cp} ranks"
            return Outcome(
                status="skipped",
                error=(
                    f"needs {needs} but this torchrun job has {world}; run it in a job of {case.cp} ranks "
                    f"(torchrun --nproc-per-node {case.cp} ...)"
                ),
            )
        if self._stuck is not None:
            return Outcome(status="skipped", error=f"not run: {self._stuck}")
        assert self._runner is not None, "run() outside group()"

        def on_ranks(group: ProcessGroup | None) -> Any:
            if self.takes_group:
                return self.rank_fn(case, self.platform.device_type, group=group)
            return self.rank_fn(case, self.platform.device_type)

        try:
            end = self._runner.run(case.cp, on_ranks, own_group=self.takes_group)
        except JobStuck as exc:
            self._stuck = str(exc)
            return Outcome(status="failed", error=str(exc), wall_s=time.perf_counter() - start)
        wall = time.perf_counter() - start
        if end.error is not None:
            return Outcome(status="failed", error=failure_line(end.error), wall_s=wall)
        return Outcome(status="ok", results=end.results, wall_s=wall)


def _make_launcher(
    platform: Platform, job: TorchrunEnv | None, suite: Suite, rank_fn: RankFn
) -> LocalLauncher | TorchrunLauncher:
    """The launcher of a command's cases: local launches, or this rank of a torchrun job."""
    settings = {"threads_per_rank": suite.config.threads_per_rank, "timeout_s": suite.config.timeout_s}
    if job is None:
        return LocalLauncher(platform, rank_fn=rank_fn, **settings)
    return TorchrunLauncher(platform, job, rank_fn=rank_fn, **settings)


def _max_local_ranks(platform: Platform, job: TorchrunEnv | None) -> int | None:
    """Local launches: one rank per accelerator; on cpu, MAX_RANKS_PER_CORE per core. Under torchrun the
    job decides (None: unchecked)."""
    if job is not None:
        return None
    if platform.device_type == "cpu":
        return MAX_RANKS_PER_CORE * (os.cpu_count() or 1)
    return len(probe_devices(platform))


def warn_oversubscription(cases: Sequence[Case], launcher: LocalLauncher | TorchrunLauncher) -> None:
    """One warning per CP degree whose ranks' threads exceed the cores."""
    for cp in sorted({c.cp for c in cases}):
        case = next(c for c in cases if c.cp == cp)
        warning = oversubscription_warning(launcher.ranks_on_host(case), launcher.threads_for(case))
        if warning:
            print_warning(f"cp={cp}: {warning}")


def leads(job: TorchrunEnv | None) -> bool:
    """Whether this process prints and writes results: always locally, rank 0 under torchrun."""
    return job is None or job.rank == 0


def prepare_launch(
    platform: Platform,
    job: TorchrunEnv | None,
    suite: Suite,
    selections: Sequence[Selection],
    rank_fn: RankFn,
    *,
    timed: bool = True,
) -> LocalLauncher | TorchrunLauncher:
    """The launcher of the selections' cases, once every case has passed the checks against this host
    (bench.launch.preflight: shapes, backends, local ranks, memory), before any rank starts; `timed`: the
    command times them."""
    launcher = _make_launcher(platform, job, suite, rank_fn)
    for sel in selections:
        check_cases(
            sel.locate,
            sel.scenario,
            sel.cases,
            platform=platform,
            ranks_on_host=launcher.ranks_on_host,
            max_local_ranks=_max_local_ranks(platform, job),
            local_rank=None if job is None else job.local_rank,
            timed=timed,
        )
    return launcher
