"""From Chrome traces (torch.profiler's export_chrome_trace, one per rank) to where each rank's step went.

What the traces hold (checked on torch 2.13, gloo): every torch.distributed call records its c10d op on the
calling thread (`c10d::alltoall_base_`, `c10d::_allgather_base_`, `c10d::allreduce_`, `c10d::send`,
`c10d::recv_`, ...; COLLECTIVE_OPS). gloo runs all-to-all, all-gather and all-reduce on its own worker
threads (`gloo:all_to_all`, `gloo:all_gather`, ...), while the calling thread waits for them; send and recv
run on the calling thread, inside their c10d op, and `Concrete Inputs` (record_shapes=True) holds the peer.

Definitions, per rank and profiled step (the region `bench.step`; every step starts right after a barrier,
so times measured from each rank's own step start line up across ranks to within the barrier's exit skew,
with no need for the ranks' clocks to agree):
- a collective's blocked interval: from its c10d op's start to the end of that op, or of its backend event
  when it has one (the i-th c10d op of a kind pairs with the i-th backend event of that kind);
- waiting: the part of a blocked interval spent before the peers arrived. For a group collective (the i-th
  call of a kind on every rank is the same collective): from this rank's start to the latest rank's start.
  For p2p: a receive waits from its start until the matching send (the k-th send from that peer to this
  rank) starts, and a send waits until the matching receive starts;
- each collective kind: its blocked time minus its waiting (moving data, and the backend's own work);
- compute: the step's time outside blocked intervals (kernels, Python, autograd on the calling thread).
Transfers posted ahead and waited for later (gdn_cp.distributed.transfers, the overlap of the summary
exchange): their c10d ops, inside a range flagged as posted, block only while they run (the data moves on
gloo's threads meanwhile, so their backend events do not extend them); the wait, a `gdn_cp.wait.<kind>`
range, is a blocked interval that counts as waiting in full: by then the rank has nothing else to do.
The categories add up to the step time. Averages over the profiled steps are reported.

On cuda and npu the host view differs: NCCL/HCCL collectives are asynchronous on the host, so the calling
thread does not block in them (work.wait() only makes the compute stream wait) and a `gdn_cp.wait.*` range
reads about 0 there. What overlap hides or not is then read from the device's timeline
(`device_exposure`): the kernels of the trace, each on a stream; a collective's kernels (NCCL's, HCCL's)
are communication, every other kernel compute. Exposed communication is the time some collective kernel
runs while no compute kernel runs on the device: the time its compute streams sit idle for a collective.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gdn_cp.distributed.comm_stats import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, P2P
from gdn_cp.distributed.transfers import POSTED_SUFFIX, WAIT_LABEL

STEP_LABEL = "bench.step"
"""The record_function name of one profiled step."""

COLLECTIVE_OPS: dict[str, str] = {
    "c10d::alltoall_base_": ALL_TO_ALL,
    "c10d::alltoall_": ALL_TO_ALL,
    "c10d::_allgather_base_": ALL_GATHER,
    "c10d::allgather_": ALL_GATHER,
    "c10d::allgather_into_tensor_coalesced_": ALL_GATHER,
    "c10d::allreduce_": ALL_REDUCE,
    "c10d::allreduce_coalesced_": ALL_REDUCE,
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::broadcast_": "broadcast",
    "c10d::barrier": "barrier",
    "c10d::send": P2P,
    "c10d::recv_": P2P,
    "c10d::recv_any_source_": P2P,
}
"""c10d op -> collective kind, as the backend knows it. Inside a gdn_cp collective the op is reported
under that collective's own kind instead (LABEL_PREFIX): the Conv1D halo exchange is an all-to-all-v that
the backend cannot tell from Ulysses' all-to-all, but its `gdn_cp.halo` range can."""

LABEL_PREFIX = "gdn_cp."
"""gdn_cp.distributed.collectives wraps every wire transfer in a `gdn_cp.<kind>` record_function range
(the kinds of gdn_cp.distributed.comm_stats: all_to_all, halo, all_gather, p2p, all_reduce)."""

BACKEND_EVENTS: dict[str, str] = {
    "gloo:all_to_all": ALL_TO_ALL,
    "gloo:all_gather": ALL_GATHER,
    "gloo:all_reduce": ALL_REDUCE,
    "gloo:allreduce": ALL_REDUCE,
    "gloo:reduce_scatter": "reduce_scatter",
    "gloo:broadcast": "broadcast",
    "gloo:barrier": "barrier",
}
"""Events gloo records on its worker threads for the asynchronous collectives, by kind."""

WAIT_PREFIX = WAIT_LABEL.format(kind="")
"""Starts the name of the range around the wait for a posted transfer (the kind follows)."""
WAIT_OP = "wait"
"""Collective.op of such a wait."""

PEER_ARG = 2
"""Index of the peer rank in `Concrete Inputs` of c10d::send / c10d::recv_ (tensors, group, peer, tag)."""


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective call on one rank, in microseconds from the start of its step on that rank."""

    kind: str
    """all_to_all, all_gather, p2p, all_reduce, ... (COLLECTIVE_OPS)."""
    op: str
    """The c10d op name."""
    start_us: float
    end_us: float
    """End of the blocked interval."""
    peer: int | None = None
    """p2p: the other rank (None when the trace does not say)."""

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def is_send(self) -> bool:
        return self.op == "c10d::send"

    @property
    def is_wait(self) -> bool:
        return self.op == WAIT_OP


@dataclass(slots=True)
class StepTimeline:
    duration_us: float
    collectives: list[Collective] = field(default_factory=list)


@dataclass(slots=True)
class RankTimeline:
    """What the breakdown needs from one rank's trace (small and picklable: ranks gather it)."""

    rank: int
    steps: list[StepTimeline] = field(default_factory=list)
    unpaired: int = 0
    """Asynchronous c10d ops in the steps without a backend event to pair with (their blocked time is then
    the op's own: on nccl/hccl, or when the profiler dropped the event)."""


def _x_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]


def _peer(event: dict[str, Any]) -> int | None:
    inputs = (event.get("args") or {}).get("Concrete Inputs") or []
    try:
        return int(inputs[PEER_ARG])
    except (IndexError, TypeError, ValueError):
        return None


def _label(op: dict[str, Any], labels: Sequence[dict[str, Any]]) -> tuple[str | None, bool]:
    """(the kind of the gdn_cp range enclosing a c10d op, if any; whether that range posts ahead)."""
    t0 = float(op["ts"])
    t1 = t0 + float(op["dur"])
    for label in labels:
        start = float(label["ts"])
        if start <= t0 and t1 <= start + float(label["dur"]):
            name = label["name"][len(LABEL_PREFIX) :]
            return name.removesuffix(POSTED_SUFFIX), name.endswith(POSTED_SUFFIX)
    return None, False


def _main_thread_events(
    events: list[dict[str, Any]], main: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(the c10d collective ops, by start; the waits for posted transfers, by start; the other gdn_cp
    ranges) on the thread `main`, the one that runs the steps."""
    ops = sorted(
        (e for e in events if e["name"] in COLLECTIVE_OPS and e.get("tid") == main),
        key=lambda e: float(e["ts"]),
    )
    on_main = [e for e in events if e.get("tid") == main]
    waits = sorted((e for e in on_main if e["name"].startswith(WAIT_PREFIX)), key=lambda e: float(e["ts"]))
    labels = [
        e for e in on_main if e["name"].startswith(LABEL_PREFIX) and not e["name"].startswith(WAIT_PREFIX)
    ]
    return ops, waits, labels


def _backend_events(events: list[dict[str, Any]]) -> defaultdict[str, list[dict[str, Any]]]:
    """Collective kind -> the backend's events of that kind (BACKEND_EVENTS), by start."""
    backend: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in sorted((e for e in events if e["name"] in BACKEND_EVENTS), key=lambda e: float(e["ts"])):
        backend[BACKEND_EVENTS[e["name"]]].append(e)
    return backend


def _pair_ops(
    ops: list[dict[str, Any]],
    labels: list[dict[str, Any]],
    backend: defaultdict[str, list[dict[str, Any]]],
) -> tuple[dict[int, float], set[int], dict[int, tuple[str | None, bool]]]:
    """(op index -> end of its blocked interval; the asynchronous ops left without a backend event; op
    index -> its gdn_cp range's kind and whether it posts ahead, _label)."""
    # Pair the i-th asynchronous op of a kind with the i-th backend event of that kind (same order: the
    # calling thread waits for each before it issues the next).
    taken: dict[str, int] = defaultdict(int)
    ends: dict[int, float] = {}
    unpaired: set[int] = set()
    kinds: dict[int, tuple[str | None, bool]] = {}
    for i, op in enumerate(ops):
        kind = COLLECTIVE_OPS[op["name"]]
        kinds[i] = _label(op, labels)
        end = float(op["ts"]) + float(op["dur"])
        if kind != P2P:
            if taken[kind] < len(backend[kind]):
                event = backend[kind][taken[kind]]
                taken[kind] += 1
                if not kinds[i][1]:  # posted ahead: the caller computes while gloo moves the data
                    end = max(end, float(event["ts"]) + float(event["dur"]))
            else:
                unpaired.add(i)
        ends[i] = end
    return ends, unpaired, kinds


def _step_ops(
    step: dict[str, Any],
    ops: list[dict[str, Any]],
    ends: dict[int, float],
    unpaired: set[int],
    kinds: dict[int, tuple[str | None, bool]],
) -> tuple[list[Collective], int]:
    """(the c10d ops that start in `step`, as Collectives timed from its start; how many are unpaired)."""
    start, stop = float(step["ts"]), float(step["ts"]) + float(step["dur"])
    collectives, count = [], 0
    for i, op in enumerate(ops):
        t = float(op["ts"])
        if start <= t < stop:
            kind = COLLECTIVE_OPS[op["name"]]
            count += i in unpaired
            collectives.append(
                Collective(
                    kind=kinds[i][0] or kind,
                    op=op["name"],
                    start_us=t - start,
                    end_us=min(ends[i], stop) - start,
                    peer=_peer(op) if kind == P2P else None,
                )
            )
    return collectives, count


def _step_waits(step: dict[str, Any], waits: list[dict[str, Any]]) -> list[Collective]:
    """The waits for posted transfers that start in `step`, as Collectives timed from its start."""
    start, stop = float(step["ts"]), float(step["ts"]) + float(step["dur"])
    out = []
    for w in waits:
        t = float(w["ts"])
        if start <= t < stop:
            end = min(t + float(w["dur"]), stop)
            kind = w["name"][len(WAIT_PREFIX) :]
            out.append(Collective(kind=kind, op=WAIT_OP, start_us=t - start, end_us=end - start))
    return out


def read_timeline(trace: dict[str, Any], rank: int) -> RankTimeline:
    """The profiled steps of one rank's Chrome trace and the collectives inside each."""
    events = _x_events(trace)
    steps = sorted((e for e in events if e["name"] == STEP_LABEL), key=lambda e: float(e["ts"]))
    timeline = RankTimeline(rank=rank)
    if not steps:
        return timeline
    ops, waits, labels = _main_thread_events(events, steps[0].get("tid"))
    ends, unpaired, kinds = _pair_ops(ops, labels, _backend_events(events))
    for step in steps:
        collectives, step_unpaired = _step_ops(step, ops, ends, unpaired, kinds)
        timeline.unpaired += step_unpaired
        collectives += _step_waits(step, waits)
        collectives.sort(key=lambda c: c.start_us)
        timeline.steps.append(StepTimeline(duration_us=float(step["dur"]), collectives=collectives))
    return timeline


@dataclass(kw_only=True, slots=True)
class RankBreakdown:
    """Where one rank's step went, in microseconds, averaged over the profiled steps."""

    rank: int
    step_us: float
    compute_us: float
    collectives_us: dict[str, float] = field(default_factory=dict)
    """Per kind: blocked time minus waiting."""
    waiting_us: float = 0.0

    def categories(self) -> dict[str, float]:
        """compute, each collective kind, waiting: they add up to step_us."""
        return {"compute": self.compute_us, **self.collectives_us, "waiting": self.waiting_us}


def _waits(timelines: Sequence[RankTimeline], s: int) -> dict[tuple[int, int], float]:
    """(rank, index of the collective in step s) -> waiting time, for the collectives that can be matched."""
    waits: dict[tuple[int, int], float] = {}
    per_rank = [list(enumerate(t.steps[s].collectives)) for t in timelines]
    # group collectives: the i-th call of a kind is the same collective on every rank
    kinds = {c.kind for calls in per_rank for _, c in calls if c.kind != P2P and not c.is_wait}
    for kind in kinds:
        lists = [[(i, c) for i, c in calls if c.kind == kind and not c.is_wait] for calls in per_rank]
        if len({len(x) for x in lists}) != 1:
            continue  # the ranks disagree on how many there were: leave them unmatched
        for calls in zip(*lists, strict=True):
            latest = max(c.start_us for _, c in calls)
            for rank, (i, c) in enumerate(calls):
                waits[(rank, i)] = min(max(0.0, latest - c.start_us), c.duration_us)
    # p2p: the k-th send from a to b matches the k-th receive on b from a
    sends: dict[tuple[int, int], list[tuple[int, Collective]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[int, Collective]]] = defaultdict(list)
    for rank, calls in enumerate(per_rank):
        for i, c in calls:
            if c.kind == P2P and c.peer is not None:
                (sends[(rank, c.peer)] if c.is_send else recvs[(c.peer, rank)]).append((i, c))
    for (src, dst), sent in sends.items():
        for (i, send), (j, recv) in zip(sent, recvs.get((src, dst), []), strict=False):
            waits[(dst, j)] = min(max(0.0, send.start_us - recv.start_us), recv.duration_us)
            waits[(src, i)] = min(max(0.0, recv.start_us - send.start_us), send.duration_us)
    return waits


def breakdown(timelines: Sequence[RankTimeline]) -> list[RankBreakdown]:
    """Per rank, the mean over steps of compute, each collective kind and waiting (module docstring).

    `timelines`: one per rank of the group, any order (matched by rank: p2p peers are group ranks)."""
    timelines = sorted(timelines, key=lambda t: t.rank)
    if [t.rank for t in timelines] != list(range(len(timelines))):
        raise ValueError(f"need one timeline per rank 0..n-1, got ranks {[t.rank for t in timelines]}")
    n_steps = min((len(t.steps) for t in timelines), default=0)
    totals = [RankBreakdown(rank=t.rank, step_us=0.0, compute_us=0.0) for t in timelines]
    for s in range(n_steps):
        waits = _waits(timelines, s)
        for r, t in enumerate(timelines):
            step = t.steps[s]
            out = totals[r]
            out.step_us += step.duration_us
            blocked = 0.0
            for i, c in enumerate(step.collectives):
                wait = c.duration_us if c.is_wait else waits.get((r, i), 0.0)
                blocked += c.duration_us
                out.waiting_us += wait
                out.collectives_us[c.kind] = out.collectives_us.get(c.kind, 0.0) + c.duration_us - wait
            out.compute_us += max(0.0, step.duration_us - blocked)
    if n_steps:
        for out in totals:
            out.step_us /= n_steps
            out.compute_us /= n_steps
            out.waiting_us /= n_steps
            out.collectives_us = {k: v / n_steps for k, v in sorted(out.collectives_us.items())}
    return totals


@dataclass(frozen=True, slots=True)
class Straggler:
    """The rank with the longest step, and the category that makes it longest."""

    rank: int
    step_us: float
    excess_us: float
    """Its step time minus the mean of the other ranks'."""
    phase: str
    """The category whose time exceeds the other ranks' mean the most."""
    phase_excess_us: float


def straggler(breakdowns: Sequence[RankBreakdown]) -> Straggler | None:
    """The straggler and the phase behind the rank-max; None with fewer than two ranks."""
    if len(breakdowns) < 2:
        return None
    slow = max(breakdowns, key=lambda b: b.step_us)
    others = [b for b in breakdowns if b.rank != slow.rank]
    categories = sorted({k for b in breakdowns for k in b.categories()})

    def mean_other(key: str) -> float:
        return sum(b.categories().get(key, 0.0) for b in others) / len(others)

    excess = {k: slow.categories().get(k, 0.0) - mean_other(k) for k in categories}
    phase = max(excess, key=lambda k: excess[k])
    return Straggler(
        rank=slow.rank,
        step_us=slow.step_us,
        excess_us=slow.step_us - sum(b.step_us for b in others) / len(others),
        phase=phase,
        phase_excess_us=excess[phase],
    )


COMM_KERNEL_PREFIXES = ("nccl", "hccl", "hcom", "ncclDevKernel", "ncclKernel")
"""Lower-cased starts of the names of a collective's device kernels (NCCL's on cuda; HCCL's on npu)."""
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
"""Chrome-trace categories of work on the device's streams."""
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
"""Chrome-trace categories of the host's launch calls, which share a `correlation` id with their kernel."""
DEVICE_STEP_CATEGORY = "gpu_user_annotation"
"""The device-side span Kineto draws for a record_function range (first kernel launched in it to last)."""


@dataclass(frozen=True, slots=True)
class DeviceExposure:
    """One rank's device timeline, per profiled step (microseconds, averages over the steps)."""

    communication_us: float
    """Time at least one collective kernel ran."""
    exposed_us: float
    """Of that, the time no compute kernel ran alongside: communication the compute did not hide."""

    @property
    def hidden(self) -> float:
        """The share of the communication that overlapped compute (1: fully hidden)."""
        return 1.0 - self.exposed_us / self.communication_us if self.communication_us > 0 else 1.0


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of the (disjoint, sorted) intervals `a` outside the (disjoint, sorted) intervals `b`."""
    out = []
    for start, end in a:
        cursor = start
        for b0, b1 in b:
            if b1 <= cursor or b0 >= end:
                continue
            if b0 > cursor:
                out.append((cursor, b0))
            cursor = max(cursor, b1)
        if cursor < end:
            out.append((cursor, end))
    return out


def _span(event: dict[str, Any]) -> tuple[float, float]:
    start = float(event["ts"])
    return start, start + float(event["dur"])


def _inside(t: float, spans: list[tuple[float, float]]) -> bool:
    return any(start <= t <= end for start, end in spans)


def step_kernels(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The device kernels of the profiled steps (STEP_LABEL ranges): those launched inside a step's CPU
    range (launch and kernel share a correlation id), else, without launch events, those starting inside a
    step's device-side span. What runs between steps (the barrier that lines the ranks up, an all-reduce
    with no compute beside it that absorbs their skew) is not the step's. A trace without step ranges: every
    kernel."""
    events = _x_events(trace)
    kernels = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    labelled = [e for e in events if e["name"] == STEP_LABEL]
    host_steps = [_span(e) for e in labelled if e.get("cat") != DEVICE_STEP_CATEGORY]
    device_steps = [_span(e) for e in labelled if e.get("cat") == DEVICE_STEP_CATEGORY]
    launches = {
        (e.get("args") or {}).get("correlation"): float(e["ts"])
        for e in events
        if e.get("cat") in LAUNCH_CATEGORIES
    }
    launches.pop(None, None)
    if host_steps and launches:
        correlated = [(k, launches.get((k.get("args") or {}).get("correlation"))) for k in kernels]
        return [k for k, launched in correlated if launched is not None and _inside(launched, host_steps)]
    if device_steps:
        return [k for k in kernels if _inside(float(k["ts"]), device_steps)]
    return kernels


def device_exposure(trace: dict[str, Any], steps: int) -> DeviceExposure | None:
    """Communication and its exposed part on the device's timeline of one rank's trace (module docstring),
    per step (`steps` profiled steps), counting only the steps' own kernels (`step_kernels`); None when the
    trace holds no device kernels (cpu)."""
    kernels = step_kernels(trace)
    if not kernels or steps < 1:
        return None
    comm, compute = [], []
    for e in kernels:
        start = float(e["ts"])
        span = (start, start + float(e["dur"]))
        (comm if e["name"].lower().startswith(COMM_KERNEL_PREFIXES) else compute).append(span)
    comm_u, compute_u = _union(comm), _union(compute)
    return DeviceExposure(
        communication_us=_length(comm_u) / steps, exposed_us=_length(_minus(comm_u, compute_u)) / steps
    )
