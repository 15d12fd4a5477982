"""A pool of local ranks that runs many cases in one lifetime, with every case's failure kept to that case.

    with RankPool(cp, fn, device="cpu", threads=1, timeout_s=600) as pool:
        for case in cases:
            answer = pool.run(case)         # PoolAnswer: rank 0's value, or a RankFailure

One pool is `world_size` processes (bench.launch.pool_rank, forked from the server of
bench.launch.local.rank_context, dying with this process: bench.launch.lifeline) in one process group,
bootstrapped from a TCPStore this process hosts on 127.0.0.1 (bench.launch.local.loopback_store: nothing
listens beyond this host). Starting
the ranks and the process group still costs something per lifetime; a pool pays it once for all the cases
it runs, instead of once per case.

Fault isolation: a case whose rank raises, dies (a crash, the out-of-memory killer) or stops answering
fails alone. Its answer is a RankFailure with the root cause: a rank's own exception or death before
another rank's "connection reset" echo; the pool is then broken (its process group may hold half a
collective), its ranks are killed, and `run` starts a new pool for the next case. Every case has a
wall-clock limit (`timeout_s`; the ranks' collective timeout is INSPECT_S longer): a rank stopped or stuck
outside a collective fails the case within the limit plus about GRACE_S + DUMP_WAIT_S seconds, naming that
rank and what it was doing (bench.launch.stuck), and the others as waiting in their collective.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from bench.launch.local import RankFailure, is_peer_error, loopback_store, rank_context
from bench.launch.pool_rank import RankSetup, rank_main
from bench.launch.stuck import DUMP_WAIT_S, inspect_ranks, stuck_ranks
from bench.launch.user_backends import rank_env

GRACE_S = 1.5
"""After the first failure of a case, how long the other ranks' reports are awaited (the root cause may
arrive second: a peer's "connection reset" can be read before the error that caused it)."""
JOIN_S = 5.0
"""How long ranks told to leave may take before they are killed."""
START_S = 300.0
"""The least time ranks get to start and join the process group (Python, torch and the backend's set-up
take seconds per rank on a busy machine: more than a short case limit)."""
INSPECT_S = GRACE_S + DUMP_WAIT_S + 2.0
"""How much longer the ranks' collective timeout is than a case's wall-clock limit: a case stuck outside a
collective is inspected at the limit while the other ranks still wait in theirs (named as such), instead of
racing their own timeout to the inspection."""
TIMEOUT_MARKERS = ("Timed out", "timed out", "Timeout")
"""A rank's error that says it waited too long in a collective: a victim, like a peer's echo."""


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def describe_exit(code: int | None) -> str:
    """How a rank process ended without reporting an error."""
    if code is None:
        return "its pipe closed while the process still ran"
    if code < 0:
        name = _signal_name(code)
        hint = " (SIGKILL: often the out-of-memory killer)" if name == "SIGKILL" else ""
        return f"killed by signal {name}{hint}"
    return f"exited with code {code} without a Python exception (os._exit or a native crash)"


@dataclass(kw_only=True, slots=True)
class PoolAnswer:
    """What one case came back with."""

    value: Any = None
    """Rank 0's return value (ok only)."""
    failure: RankFailure | None = None
    """Why the case failed: the root cause's rank and message."""
    wall_s: float = 0.0
    """From handing the case to the ranks to the last answer (starting the pool not included)."""
    lifetime: str | None = None
    """The id of the pool lifetime that ran it (RankPool.lifetime)."""

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(kw_only=True, slots=True)
class _Report:
    kind: str
    """done, error or died."""
    text: str = ""
    value: Any = None
    at: float = field(default_factory=time.monotonic)


class RankPool:
    """`world_size` local ranks running `fn(payload, device)` per `run` (module docstring)."""

    def __init__(
        self,
        world_size: int,
        fn: Callable[[Any, str], Any],
        *,
        device: str,
        threads: int,
        timeout_s: float,
        env: dict[str, str] | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        self.world_size = world_size
        self.fn = fn
        self.preload = tuple(preload)
        """Modules the ranks' server imports besides the rank function's (rank_context)."""
        self.device = device
        self.threads = threads
        self.timeout_s = timeout_s
        self.env = {**rank_env(), **(env or {})}
        """The ranks' extra environment: `env` beside the user's backends (bench.launch.user_backends)."""
        self.starts = 0
        """Pool lifetimes started so far (restarts after failures included)."""
        self.lifetime: str | None = None
        """The current lifetime's id (its store prefix), a new one at every start; None before the first."""
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._conns: list[Connection] = []
        self._thread_ids: dict[int, int] = {}
        self._store: Any = None
        self._folder: Path | None = None
        self._index = 0

    # -- lifetime --------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return bool(self._procs)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the ranks and wait until all have joined the process group; RankFailure if one fails
        first or they take longer than timeout_s (the pool is then closed)."""
        self.close()
        self.starts += 1
        self._folder = Path(tempfile.mkdtemp(prefix="bench-pool-"))
        self._store = loopback_store(datetime.timedelta(seconds=self.timeout_s))
        prefix = self.lifetime = f"pool-{uuid.uuid4().hex}"
        ctx = rank_context([rank_main.__module__, self.fn.__module__, *self.preload])
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            setup = RankSetup(
                rank=rank,
                world_size=self.world_size,
                store_port=self._store.port,
                prefix=prefix,
                device=self.device,
                threads=self.threads,
                timeout_s=self.timeout_s + INSPECT_S,
                fn=self.fn,
                env=self.env,
                dump_path=str(self._dump(rank)),
            )
            proc = ctx.Process(
                target=rank_main, args=(setup, child_end), name=f"bench-rank-{rank}", daemon=True
            )
            proc.start()
            child_end.close()  # the rank's end lives in the rank: its death closes the pipe
            self._procs.append(proc)
            self._conns.append(parent_end)
        limit = max(self.timeout_s, START_S)
        deadline = time.monotonic() + limit
        reports = self._collect(lambda r: r.kind == "ready", deadline)
        if all(reports.get(r) is not None and reports[r].kind == "ready" for r in range(self.world_size)):
            self._thread_ids = {r: int(reports[r].value) for r in range(self.world_size)}
            return
        failure = self._root_cause(reports, deadline=deadline, limit=limit, what="starting the pool")
        self.close(kill=True)
        raise failure

    def close(self, *, kill: bool = False) -> None:
        """Tell the ranks to leave and kill those that do not within JOIN_S; `kill`: kill them at once (a
        broken pool: its ranks may wait in a collective that never completes, or be stopped). Clean up."""
        if not kill:
            for conn in self._conns:
                with contextlib.suppress(OSError):  # a rank that is gone
                    conn.send(None)
            deadline = time.monotonic() + JOIN_S
            for proc in self._procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        self._kill()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._thread_ids, self._store = [], [], {}, None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()  # SIGKILL: also ends a stopped process
        for proc in self._procs:
            proc.join(JOIN_S)

    def _dump(self, rank: int) -> Path:
        assert self._folder is not None
        return self._folder / f"rank{rank}.stacks"

    # -- cases -----------------------------------------------------------------------------------------

    def run(self, payload: Any) -> PoolAnswer:
        """Run `fn(payload, device)` on every rank (starting the pool first if it is not running): rank 0's
        value, or the case's RankFailure. After a failure the pool is closed; the next run starts another."""
        if not self.alive:
            try:
                self.start()
            except RankFailure as failure:
                return PoolAnswer(failure=failure)
        self._index += 1
        index = self._index
        start = time.monotonic()
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a rank that is gone: _collect sees it
                conn.send((index, payload))
        deadline = start + self.timeout_s
        reports = self._collect(lambda r: r.kind == "done", deadline, index=index)
        wall = time.monotonic() - start
        if len(reports) == self.world_size and all(r.kind == "done" for r in reports.values()):
            return PoolAnswer(value=reports[0].value, wall_s=wall, lifetime=self.lifetime)
        failure = self._root_cause(reports, deadline=deadline, limit=self.timeout_s, what="the case")
        self.close(kill=True)
        return PoolAnswer(failure=failure, wall_s=time.monotonic() - start)

    def _collect(self, good: Callable[[_Report], bool], deadline: float, index: int | None = None) -> dict:
        """Each rank's report until all are in, GRACE_S after the first bad one, or the deadline."""
        reports: dict[int, _Report] = {}
        first_bad: float | None = None
        by_conn = {id(c): r for r, c in enumerate(self._conns)}
        while len(reports) < self.world_size:
            until = deadline if first_bad is None else min(deadline, first_bad + GRACE_S)
            left = until - time.monotonic()
            if left <= 0:
                break
            pending = [c for r, c in enumerate(self._conns) if r not in reports]
            for conn in wait(pending, timeout=min(left, 0.5)):
                rank = by_conn[id(conn)]
                report = self._read(rank, conn, index)
                if report is None:
                    continue
                reports[rank] = report
                if not good(report) and first_bad is None:
                    first_bad = report.at
        return reports

    def _read(self, rank: int, conn: Connection, index: int | None) -> _Report | None:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            proc = self._procs[rank]
            proc.join(1.0)
            return _Report(kind="died", text=describe_exit(proc.exitcode))
        kind = message[0]
        if kind == "ready":
            return _Report(kind="ready", value=message[2])
        if index is not None and message[1] != index:
            return None  # an answer to an earlier case (cannot happen: a failure closes the pool)
        if kind == "done":
            return _Report(kind="done", value=message[2])
        return _Report(kind="error", text=str(message[2]))

    def _root_cause(
        self, reports: dict[int, _Report], *, deadline: float, limit: float, what: str
    ) -> RankFailure:
        """The failure to report: the earliest error or death that is not a victim's (a peer's echo or a
        collective timeout); else the ranks that did not answer, inspected; else the earliest error."""
        bad = {r: rep for r, rep in reports.items() if rep.kind in ("error", "died")}

        def victim(rep: _Report) -> bool:
            waited = is_peer_error(rep.text) or any(m in rep.text for m in TIMEOUT_MARKERS)
            return rep.kind == "error" and waited

        causes = sorted((rep.at, r) for r, rep in bad.items() if not victim(rep))
        if causes:
            rank = causes[0][1]
            return RankFailure(rank, bad[rank].text)
        silent = {r: self._procs[r].pid for r in range(self.world_size) if r not in reports}
        if silent and all(pid is not None for pid in silent.values()):
            dumps = {r: self._dump(r) for r in silent}
            states = inspect_ranks(silent, self._thread_ids, dumps)  # type: ignore[arg-type]
            blamed = stuck_ranks(states)
            if time.monotonic() >= deadline:
                why = f"{what} passed its wall-clock limit of {limit:g} s"
            else:
                why = f"{what} did not finish"
            others = [s for s in states if s not in blamed]
            detail = "; ".join(f"rank {s.rank} {s.describe()}" for s in [*blamed, *others])
            return RankFailure(blamed[0].rank, f"stuck: {why}: {detail}")
        rank = min(bad, key=lambda r: (bad[r].at, r))
        return RankFailure(rank, bad[rank].text)
