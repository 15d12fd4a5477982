"""One torchrun job (one node or many) that sweeps every case whose cp fits its world size.

A job of W ranks runs a case of cp <= W in a process group of its own over global ranks 0 .. cp - 1
(`dist.new_group`, which every rank creates in the same order: the order of the cases is agreed), while
ranks cp .. W - 1 wait; so one allocation sweeps cp 1 .. W. A case's outcome travels through the job's
store, never through a collective of the job, so a case that fails, even outside a collective, fails alone:

- a member whose rank function raises first aborts its own side of the case's group (NCCL: its
  communicators, so that none of its kernels stays queued against peers), then records its error under the
  case's key and takes no further part;
- every member watches that key from a thread (FailureWatch) and, once a peer failed, aborts the case's
  group (NCCL: its communicators, which ends a collective still waiting for the failed peer; gloo cannot end
  a blocked operation, which then fails at the case's timeout, the case's own limit). On NCCL the watch also
  aborts the group once the case has run past its limit (its timeout): a collective that never completes
  ends there, and the case fails. The group is aborted once per rank, by the first of the rank's own failure
  and its watch (torch raises on a second abort of a group it has dropped);
- torch's abort (`_abort_process_group`) is experimental and documented with
  TORCH_NCCL_ASYNC_ERROR_HANDLING=0. Any other value lets ProcessGroupNCCL's watchdog handle an error or a
  timeout itself: 1 (TearDown, what torchrun's agent sets in every worker) and 3 (SkipCleanUp, torch's
  default) end the whole process, so one failed case would end the job; 2 (CleanUpOnly) aborts the
  communicators without ending it. Under 0 the job does both itself (the watch: a peer's failure, the
  limit), so every rank sets 0 before its first process group exists (`own_nccl_errors`), whatever torchrun
  set, and rank 0 says so when it replaced another value;
- then every rank of the job meets at a store barrier, reads the case's errors (the root cause: the first
  that is not a peer's echo) and destroys the case's group. The job's default group is never used by a
  case and stays sound for the next one.
- Creating a case's group (an ncclCommSplit on NCCL, a store rendezvous on gloo) and destroying it are
  bounded by the case's timeout: a rank wedged in either (a peer gone, a communicator that never returns:
  pytorch/pytorch#132696, NVIDIA/nccl#1013) raises JobStuck, which stops the sweep, keeping its results,
  instead of hanging the job. The thread left behind cannot be stopped; the process exits with the sweep.

On NCCL this has been read against torch's documentation and source (ProcessGroupNCCL's watchdog and
abort) and tested on gloo by fault injection at each point (tests/bench/launch/test_job_faults.py, and
under torchrun itself, test_torchrun_faults.py); it has not yet run on GPUs.

Before the first case the ranks exchange their node's environment (`agree_on_nodes`): a node with other
code, another torch or other devices would make the results incomparable, and every rank refuses it
together, naming the nodes and values.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from bench.errors import UserError
from bench.launch.local import is_peer_error
from bench.results.env import NodeEnvironment

T = TypeVar("T")

TIMEOUT_MARKERS = ("Timed out", "timed out", "Timeout", "timeout")
"""Words of a rank's error that was only waiting for a peer (gloo's and NCCL's collective timeouts)."""
WATCH_INTERVAL_S = 0.05
"""How often a member looks for a peer's failure."""
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
"""Read by each ProcessGroupNCCL when it is created: 0 leaves NCCL's errors and timeouts to the job."""
ABORTABLE = frozenset({"nccl"})
"""Backends whose blocked collective an abort ends (abort_group): there a case is held to its limit too."""
BARRIER_MARGIN_S = 10.0
"""The end-of-case barrier waits this much longer than the case's limit (a member timing out in gloo)."""


def job_store(timeout: datetime.timedelta) -> dist.Store:
    """A client of the job's store (MASTER_ADDR:MASTER_PORT, the torchrun agent's), its keys under this
    run and restart, so that a restarted job never reads an earlier attempt's keys."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    run = os.environ.get("TORCHELASTIC_RUN_ID", "job")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"bench/{run}/{attempt}", store)


def agree_on_nodes(local: NodeEnvironment) -> list[NodeEnvironment]:
    """Every node's environment, one per node (from its first rank), the same list on every rank; UserError
    on every rank when the nodes differ in what makes results comparable (NodeEnvironment.COMPARED)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    nodes: dict[int, NodeEnvironment] = {}
    for node in everyone:
        nodes.setdefault(node.node, node)
    listed = [nodes[n] for n in sorted(nodes)]
    # json.dumps: a hashable form of every compared value (kernel_versions is a dict)
    differing = [
        f
        for f in NodeEnvironment.COMPARED
        if len({json.dumps(getattr(n, f), sort_keys=True) for n in listed}) > 1
    ]
    if differing:
        described = "; ".join(
            f"{name}: " + ", ".join(f"node {n.node} ({n.hostname}) {getattr(n, name)!r}" for n in listed)
            for name in differing
        )
        raise UserError(
            f"the job's nodes differ ({described}): their results would not be comparable; run the same "
            "checkout (committed), torch and devices on every node"
        )
    return listed


@dataclass(frozen=True, slots=True)
class CaseEnd:
    """What one case came to on this rank (the same on every rank of the job)."""

    results: Any = None
    """Rank 0's return value of the rank function, on every rank; None on failure."""
    error: str | None = None
    """`rank <r> failed: <error>` of the root cause, or None."""


def own_nccl_errors() -> str | None:
    """Set TORCH_NCCL_ASYNC_ERROR_HANDLING=0 in this process, for the process groups it creates from now on
    (module docstring: the job aborts a failed or overrun case's group itself); the value it replaced when
    that was another (torchrun's 1), else None."""
    before = os.environ.get(NCCL_ERROR_HANDLING)
    os.environ[NCCL_ERROR_HANDLING] = "0"
    return None if before in (None, "0") else before


class FailureWatch:
    """While its block runs, watches the case's failure count (and, given `limit_s`, the time) from a
    thread; once a peer has failed, or the block has run `limit_s` seconds, it aborts the case's group
    (`abort`), so that a collective waiting for that peer ends. The rank's own failure aborts through
    `abort_once` too, so that the group is aborted once, whoever comes first."""

    def __init__(
        self, store: dist.Store, key: str, abort: Callable[[], None], limit_s: float | None = None
    ) -> None:
        self.store, self.key, self.abort, self.limit_s = store, key, abort, limit_s
        self.reason: str | None = None
        """Why the group was aborted: "peer" (a peer failed), "limit", "own" (this rank failed); None: not."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="bench-failure-watch", daemon=True)

    def abort_once(self, reason: str) -> bool:
        """Abort the group for `reason` unless it was already aborted; whether this call aborted it."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
        self.abort()
        return True

    def _watch(self) -> None:
        deadline = None if self.limit_s is None else time.monotonic() + self.limit_s
        while not self._stop.wait(WATCH_INTERVAL_S):
            if self.store.add(self.key, 0) > 0:  # add 0: an atomic read of the count
                self.abort_once("peer")  # a no-op when this rank's own failure aborted it first
                return
            if deadline is not None and time.monotonic() >= deadline:
                self.abort_once("limit")
                return

    def __enter__(self) -> FailureWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def abort_group(group: ProcessGroup, backend: str) -> None:
    """End what `group` is blocked in: NCCL aborts its communicators (torch's _abort_process_group, which
    NCCL alone implements); other backends cannot, and their blocked operation ends at its timeout."""
    if backend == "nccl":
        dist.distributed_c10d._abort_process_group(group)


def root_cause(errors: dict[int, dict[str, Any]]) -> str:
    """The error to report: the earliest that is neither a peer's echo nor a wait that timed out."""

    def echo(message: str) -> bool:
        return is_peer_error(message) or any(m in message for m in TIMEOUT_MARKERS)

    rank = min(errors, key=lambda r: (echo(errors[r]["message"]), errors[r]["time"], r))
    return f"rank {rank} failed: {errors[rank]['message']}"


class CaseRunner:
    """Runs the job's cases one after another (module docstring); every rank calls `run` for every case,
    in the same order."""

    def __init__(self, *, backend: str, timeout_s: float, store: dist.Store, watch_store: dist.Store) -> None:
        self.backend = backend
        self.timeout_s = timeout_s
        self.store = store
        self.watch_store = watch_store  # a client of its own: the watcher's thread must not share a socket
        self.index = 0

    def run(self, cp: int, fn: Callable[[ProcessGroup | None], Any], *, own_group: bool) -> CaseEnd:
        """`fn(group)` on global ranks 0 .. cp - 1: in a new group of its own (`own_group`), else in the
        job's default group (a rank function that takes no group: then cp is the world size)."""
        rank, world = dist.get_rank(), dist.get_world_size()
        key = f"case/{self.index}"
        self.index += 1
        timeout = datetime.timedelta(seconds=self.timeout_s)
        group = None
        if own_group:
            group = bounded(
                lambda: dist.new_group(list(range(cp)), timeout=timeout),
                self.timeout_s,
                "creating the case's process group",
                on_device=self.backend != "gloo",
            )
        if rank < cp:
            # the job's default group is never aborted: only a case's own group is watched
            watch = (
                FailureWatch(
                    self.watch_store,
                    f"{key}/failed",
                    lambda: abort_group(group, self.backend),
                    limit_s=self.timeout_s if self.backend in ABORTABLE else None,
                )
                if own_group
                else None
            )
            with watch or contextlib.nullcontext():
                try:
                    results = fn(group)
                    if watch is not None and watch.reason == "limit":
                        # its collectives were cut short: whatever it returned is not the case's result
                        raise TimeoutError("its collectives were cut short, so what it returned is void")
                    if rank == 0:  # every rank keeps the same record of the case (the sweep's bookkeeping)
                        self.store.set(f"{key}/results", pickle.dumps(results))
                except Exception as exc:
                    if watch is not None:  # a case group of its own
                        watch.abort_once("own")  # its own side first: nothing left queued
                    message = f"{type(exc).__name__}: {exc}"
                    if watch is not None and watch.reason == "peer":
                        message = f"{message} (the case's group was aborted after a peer failed)"
                    elif watch is not None and watch.reason == "limit":
                        message = (
                            f"{message} (the case's group was aborted at its limit of {self.timeout_s:g} s)"
                        )
                    record = {"message": message, "time": time.time()}
                    self.store.set(f"{key}/error/{rank}", json.dumps(record))
                    self.store.add(f"{key}/failed", 1)
        self._barrier(key, world)
        errors = {
            r: json.loads(self.store.get(f"{key}/error/{r}"))
            for r in range(cp)
            if self.store.check([f"{key}/error/{r}"])
        }
        if group is not None:
            bounded(
                lambda: _destroy(group),
                self.timeout_s,
                "destroying the case's process group",
                on_device=self.backend != "gloo",
            )
        if errors:
            return CaseEnd(error=root_cause(errors))
        return CaseEnd(results=pickle.loads(self.store.get(f"{key}/results")))

    def _barrier(self, key: str, world: int) -> None:
        """Every rank of the job has finished the case (a store barrier: no collective of the job)."""
        self.store.set(f"{key}/done/{dist.get_rank()}", "1")
        keys = [f"{key}/done/{r}" for r in range(world)]
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout_s + BARRIER_MARGIN_S))
        except (dist.DistStoreError, RuntimeError):
            missing = [r for r in range(world) if not self.store.check([f"{key}/done/{r}"])]
            raise JobStuck(missing, self.timeout_s + BARRIER_MARGIN_S) from None


class JobStuck(RuntimeError):
    """Ranks that did not finish a step of a case within its limit (the case itself, stuck outside any
    collective; or creating or destroying its group): they keep the job from the next case's group, so the
    sweep stops (its results are kept)."""

    def __init__(
        self,
        ranks: Sequence[int],
        waited_s: float,
        step: str = "the case",
        why: str = "stuck outside a collective",
    ) -> None:
        super().__init__(
            f"rank(s) {list(ranks)} did not finish {step} within {waited_s:.0f} s ({why}): the job cannot go "
            "on; the finished cases are kept"
        )
        self.ranks = list(ranks)


def _destroy(group: ProcessGroup) -> None:
    # an aborted group may already be gone from torch's registry: nothing left to destroy then
    with contextlib.suppress(ValueError, RuntimeError):
        dist.destroy_process_group(group)


def bounded(fn: Callable[[], T], timeout_s: float, step: str, *, on_device: bool = False) -> T:
    """fn() on a thread of its own, waited for at most `timeout_s` seconds: its result, or JobStuck naming
    this rank and `step` when it overran or raised (a group that cannot be created or destroyed leaves the
    job unable to go on). `on_device`: the thread takes the caller's current accelerator first (CUDA's and
    the NPU's current device is per thread, and a communicator is created on it)."""
    done: dict[str, Any] = {}
    device = torch.accelerator.current_device_index() if on_device else None

    def target() -> None:
        if device is not None:
            torch.accelerator.set_device_index(device)
        try:
            done["value"] = fn()
        except BaseException as exc:  # reported on the caller's thread
            done["error"] = exc

    thread = threading.Thread(target=target, name=f"bench-{step}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    rank = dist.get_rank()
    if thread.is_alive():
        raise JobStuck([rank], timeout_s, step, "a peer is missing, or a communicator does not return")
    if "error" in done:
        error = done["error"]
        raise JobStuck([rank], timeout_s, step, f"{type(error).__name__}: {error}") from error
    return done["value"]
