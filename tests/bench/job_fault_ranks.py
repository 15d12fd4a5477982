"""Rank functions of tests/bench/launch/test_job_faults.py: a torchrun job's CaseRunner (bench.launch.job) on
real gloo ranks, with a fault injected at one point of a case."""

from __future__ import annotations

import datetime
import threading
import time

import torch
import torch.distributed as dist

from bench.launch import job

TIMEOUT_S = 3.0


class RecordingStore:
    """The job's store, recording the keys set (in order) into `events`."""

    def __init__(self, store: dist.Store, events: list[str]) -> None:
        self.store, self.events = store, events

    def set(self, key: str, value) -> None:
        self.events.append(f"set {key}")
        self.store.set(key, value)

    def add(self, key: str, amount: int) -> int:
        count = self.store.add(key, amount)
        if amount > 0:
            time.sleep(0.3)  # the failure is counted: the rank's own watch looks at the count meanwhile
        return count

    def __getattr__(self, name):
        return getattr(self.store, name)


def run_with_fault(fault: str) -> dict:
    """One case of cp 2 on a CaseRunner with `fault` injected on rank 1 ("raise": its rank function raises;
    "create": creating the case's group never returns; "destroy": destroying it never returns) or on both
    ("overrun": the case runs past its limit, on a backend whose groups abort); what this rank saw: its
    events (the aborts, the keys set, an exception in any thread), the case's end or the JobStuck message.
    Aborting a group twice raises, as torch's `_abort_process_group` does for a group it has dropped."""
    rank = dist.get_rank()
    events: list[str] = []
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    runner = job.CaseRunner(
        backend="gloo",
        timeout_s=TIMEOUT_S,
        store=RecordingStore(job.job_store(timeout), events),
        watch_store=job.job_store(timeout),
    )
    # faults are patched on bench.launch.job's names only, so that the ranks' own teardown is untouched
    aborted: list[object] = []

    def abort_group(group, backend) -> None:
        if any(g is group for g in aborted):
            raise ValueError("Invalid process group specified or has been destroyed.")
        aborted.append(group)
        events.append("abort")

    job.abort_group = abort_group
    threading.excepthook = lambda args: events.append(f"thread error: {args.exc_value!r}")
    if fault == "overrun":
        job.ABORTABLE = frozenset({"gloo"})  # held to its limit as on NCCL (the abort above is a stand-in)
    new_group = job.dist.new_group
    if rank == 1 and fault == "create":
        job.dist.new_group = lambda *a, **k: time.sleep(60)
    if rank == 1 and fault == "destroy":
        job._destroy = lambda group: time.sleep(60)

    def case(group) -> float:
        if fault == "raise" and rank == 1:
            raise RuntimeError("injected failure")
        if fault == "overrun":
            time.sleep(TIMEOUT_S + 1)  # outside any collective, then it returns as if nothing happened
            return 2.0
        t = torch.ones(4)
        dist.all_reduce(t, group=group)
        return float(t[0])

    try:
        end = runner.run(2, case, own_group=True)
    except job.JobStuck as exc:
        return {"events": events, "stuck": str(exc)}
    finally:
        job.dist.new_group = new_group
    return {"events": events, "error": end.error, "results": end.results}
