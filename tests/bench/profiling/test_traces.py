"""bench.profiling's trace analysis on hand-made timelines: ops paired with the backend's events, waiting
apart from transfer, the straggler, posted transfers, the barrier between steps, the device timeline."""

from __future__ import annotations

import pytest

from bench.profiling import RankTimeline, breakdown, read_timeline, straggler, traces
from bench.profiling.traces import Collective, StepTimeline


def test_read_timeline_pairs_ops_with_backend_events_and_reads_peers():
    def x(name, ts, dur, tid=1, **args):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}

    trace = {
        "traceEvents": [
            x("bench.step", 1000, 100),
            x("c10d::alltoall_base_", 1010, 2),
            x("gloo:all_to_all", 1012, 18, tid=2),  # the worker thread: the caller waits until 1030
            x("c10d::recv_", 1050, 30, **{"Concrete Inputs": ["", "", "1", "0"]}),
            x("c10d::allreduce_", 1200, 5),  # outside the step
        ]
    }
    timeline = read_timeline(trace, rank=0)
    (step,) = timeline.steps
    assert step.duration_us == 100 and timeline.unpaired == 0
    assert step.collectives == [
        Collective(kind="all_to_all", op="c10d::alltoall_base_", start_us=10, end_us=30),
        Collective(kind="p2p", op="c10d::recv_", start_us=50, end_us=80, peer=1),
    ]


def test_breakdown_splits_waiting_from_transfer_and_finds_the_straggler():
    # rank 1 enters the all-to-all 10 us late and sends the state 20 us after rank 0 starts waiting for it
    r0 = RankTimeline(
        rank=0,
        steps=[
            StepTimeline(
                100,
                [
                    Collective("all_to_all", "c10d::alltoall_base_", 10, 30),
                    Collective("p2p", "c10d::recv_", 50, 80, peer=1),
                ],
            )
        ],
    )
    r1 = RankTimeline(
        rank=1,
        steps=[
            StepTimeline(
                110,
                [
                    Collective("all_to_all", "c10d::alltoall_base_", 20, 30),
                    Collective("p2p", "c10d::send", 70, 75, peer=0),
                ],
            )
        ],
    )
    b0, b1 = breakdown([r1, r0])  # any order in, by rank out
    assert (b0.compute_us, b0.collectives_us, b0.waiting_us) == (50, {"all_to_all": 10, "p2p": 10}, 30)
    assert (b1.compute_us, b1.collectives_us, b1.waiting_us) == (95, {"all_to_all": 10, "p2p": 5}, 0)
    for b in (b0, b1):
        assert sum(b.categories().values()) == pytest.approx(b.step_us)
    slow = straggler([b0, b1])
    assert (slow.rank, slow.excess_us, slow.phase, slow.phase_excess_us) == (1, 10, "compute", 45)
    assert straggler([b0]) is None
    with pytest.raises(ValueError, match="one timeline per rank"):
        breakdown([r1])


def test_gdn_cp_ranges_name_the_collective_the_backend_cannot_tell_apart():
    """A c10d all-to-all inside a `gdn_cp.halo` range is the Conv1D halo, not Ulysses' exchange."""

    def x(name, ts, dur, tid=1):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {}}

    trace = {
        "traceEvents": [
            x("bench.step", 1000, 100),
            x("gdn_cp.halo", 1005, 30),
            x("c10d::alltoall_base_", 1010, 2),
            x("gloo:all_to_all", 1012, 18, tid=2),
            x("gdn_cp.all_to_all", 1040, 30),
            x("c10d::alltoall_base_", 1045, 2),
            x("gloo:all_to_all", 1047, 10, tid=2),
        ]
    }
    (step,) = read_timeline(trace, rank=0).steps
    assert [(c.kind, c.start_us, c.end_us) for c in step.collectives] == [
        ("halo", 10, 30),
        ("all_to_all", 45, 57),
    ]


def test_posted_transfers_block_only_while_posting_and_their_wait_is_waiting():
    """A transfer posted ahead (the overlap): its all-gather's backend event runs while the caller computes,
    so the blocked interval is the c10d op's own; the `gdn_cp.wait.*` range around its wait is waiting."""

    def x(name, ts, dur, tid=1):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {}}

    trace = {
        "traceEvents": [
            x("bench.step", 1000, 100),
            x("gdn_cp.all_gather:posted", 1010, 4),
            x("c10d::_allgather_base_", 1011, 2),
            x("gloo:all_gather", 1013, 40, tid=2),  # moves the data while the caller computes until 1060
            x("gdn_cp.wait.all_gather", 1060, 15),
        ]
    }
    (step,) = read_timeline(trace, rank=0).steps
    assert [(c.kind, c.op, c.start_us, c.end_us) for c in step.collectives] == [
        ("all_gather", "c10d::_allgather_base_", 11, 13),
        ("all_gather", "wait", 60, 75),
    ]
    (b,) = breakdown([RankTimeline(rank=0, steps=[step])])
    assert (b.compute_us, b.collectives_us, b.waiting_us) == (83, {"all_gather": 2}, 15)


def _kernel(name: str, ts: float, dur: float, stream: int, correlation: int | None = None) -> dict:
    args = {"stream": stream} | ({} if correlation is None else {"correlation": correlation})
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": args}


def _launch(ts: float, correlation: int) -> dict:
    args = {"correlation": correlation}
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "args": args}


def test_the_barrier_between_steps_is_not_exposed_communication():
    """Issue 35: the dist.barrier() before each profiled step is an NCCL all-reduce with no compute beside
    it (it absorbs the ranks' skew); counted, all of it read as exposed. Only kernels launched inside a
    step's CPU range count; without launch events, those inside the step's device-side span."""
    step = {"ph": "X", "cat": "user_annotation", "name": traces.STEP_LABEL}
    events = [
        _launch(0, 1),  # the barrier, before the step
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5, 400, 13, correlation=1),
        {**step, "ts": 10, "dur": 600},
        _launch(20, 2),
        _kernel("ampere_sgemm_128x64", 410, 100, 7, correlation=2),
        _launch(30, 3),
        _kernel("ncclDevKernel_SendRecv", 480, 60, 13, correlation=3),  # 480-540: 30 hidden, 30 exposed
    ]
    d = traces.device_exposure({"traceEvents": events}, steps=1)
    assert d.communication_us == pytest.approx(60) and d.exposed_us == pytest.approx(30)
    # the same trace without launch events: the step's device-side span (first to last kernel it launched)
    device_side = [e for e in events if e.get("cat") == "kernel"]
    device_side.append({**step, "cat": "gpu_user_annotation", "ts": 410, "dur": 130})
    d = traces.device_exposure({"traceEvents": device_side}, steps=1)
    assert d.communication_us == pytest.approx(60) and d.exposed_us == pytest.approx(30)


def test_exposed_communication_is_read_from_the_device_timeline():
    """Issue 20: on NCCL/HCCL the host's waits read ~0 (work.wait() only makes the stream wait), so the
    communication overlap hid is read from the device's kernels: a collective kernel's time with no
    compute kernel alongside on any stream is exposed."""
    trace = {
        "traceEvents": [
            _kernel("ampere_sgemm_128x64", 0, 100, 7),  # compute on stream 7
            _kernel("ncclDevKernel_AllGather_RING_LL", 60, 80, 13),  # 60-140: 40 hidden, 40 exposed
            _kernel("void at::native::vectorized_elementwise_kernel", 150, 20, 7),
            _kernel("ncclDevKernel_SendRecv", 160, 30, 13),  # 160-190: 10 hidden, 20 exposed
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},  # host: not counted
        ]
    }
    d = traces.device_exposure(trace, steps=2)
    assert d.communication_us == pytest.approx((80 + 30) / 2) and d.exposed_us == pytest.approx((40 + 20) / 2)
    assert d.hidden == pytest.approx(1 - 60 / 110)
    assert traces.device_exposure({"traceEvents": trace["traceEvents"][-1:]}, steps=2) is None  # cpu trace
