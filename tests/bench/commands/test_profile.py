"""`bench profile`: a real 2-rank profile (a valid Chrome trace per rank, bytes == the model, memory by kind),
the trace analysis on hand-made timelines, and choosing exactly one case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny import TINY_LAYER_YAML

from bench.cli import main
from bench.commands import profile as profile_command
from bench.profiling import RankTimeline, breakdown, read_timeline, straggler, traces
from bench.profiling.traces import Collective, StepTimeline

PROFILE = f"""\
{TINY_LAYER_YAML}cp: [2]
seq_len: [64]
mode: [ulysses, p2p]
checkpoint: [true]
pass: [forward_backward]
"""


@pytest.mark.multirank
def test_profile_writes_a_trace_per_rank_and_the_bytes_match_the_model(
    suite_dir: Path, write_scenario, capsys
):
    write_scenario("p", PROFILE)
    out = suite_dir / "prof"
    assert main(["profile", "p", "--case", "mode=p2p", "--steps", "2", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "profiling p/p2p-ckpt-cp2-T64-fwd_bwd on 2 ranks (cpu)" in printed
    assert "time per step on each rank (mean of 2 profiled steps)" in printed and "waiting" in printed
    assert "straggler: rank " in printed and "behind it: " in printed
    assert "peak total" in printed and "meter: mem_tracker" in printed
    for rank in (0, 1):
        trace = json.loads((out / f"rank{rank}.json").read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert "bench.step" in names and "c10d::send" in names and "c10d::recv_" in names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["traces"] == ["rank0.json", "rank1.json"]
    rows = summary["communication"]
    assert {(r["rank"], r["kind"]) for r in rows} == {
        (r, k)
        for r in (0, 1)
        for k in ("all_gather", "halo", "p2p")  # the header's all-gather, the halo, the state chain
    }
    assert all(r["match"] and r["counted"] == r["model"] for r in rows)
    p2p = next(r for r in rows if r["rank"] == 0 and r["kind"] == "p2p")
    assert p2p["counted"]["sent"] == 1 * 4 * 8 * 8 * 4  # one fp32 state [B, Hv, K, V] each way
    for b in summary["breakdown"]:
        parts = (
            b["compute_us"]
            + b["waiting_us"]
            + sum(
                v
                for k, v in b.items()
                if k.endswith("_us") and k not in ("step_us", "compute_us", "waiting_us")
            )
        )
        assert b["step_us"] > 0 and parts == pytest.approx(b["step_us"])
        assert b["p2p_us"] >= 0 and b["halo_us"] >= 0  # the halo exchange is told apart from all_to_all
        assert "all_to_all_us" not in b  # p2p mode runs no Ulysses exchange
    for m in summary["memory"]:
        assert (
            m["error"] is None
            and m["bytes"]["Parameter"] > 0
            and m["bytes"]["Total"] >= m["bytes"]["Parameter"]
        )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--case", "mode=ring"], "--case mode=ring matches none of the 2 cases of p; see `bench list p`"),
        (
            ["--case", "cp=2"],
            "--case cp=2 matches 2 cases of p (ulysses-cp2-T64-fwd_bwd, p2p-ckpt-cp2-T64-fwd_bwd); narrow "
            "it to one, e.g. --case ulysses-cp2-T64-fwd_bwd",
        ),
        (["--case", "mode=p2p", "--steps", "0"], "--steps 0: give a positive number of steps"),
    ],
)
def test_exactly_one_case_must_match(suite_dir: Path, write_scenario, capsys, argv, message):
    write_scenario("p", PROFILE)
    assert main(["profile", "p", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_output_that_would_overwrite_is_refused_before_any_rank_starts(
    suite_dir: Path, write_scenario, capsys, monkeypatch
):
    write_scenario("p", PROFILE)

    def no_launch(*args, **kwargs):
        raise AssertionError("ranks launched")

    monkeypatch.setattr(profile_command.Session, "launcher", no_launch)
    (suite_dir / "trace.json").write_text("{}")
    (suite_dir / "old").mkdir()
    (suite_dir / "old" / "summary.json").write_text("{}")
    for output, message in [
        ("trace.json", "--output trace.json: is a file; give a folder for the traces (a new one)"),
        ("old", "--output old: already holds a profile (summary.json or rank<r>.json), which this one would"),
    ]:
        assert main(["profile", "p", "--case", "mode=p2p", "--output", output]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert (suite_dir / "trace.json").read_text() == "{}"


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
