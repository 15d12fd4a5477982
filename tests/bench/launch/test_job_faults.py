"""Issue 35: failure isolation of a torchrun job's cases (bench.launch.job.CaseRunner) on real gloo ranks,
by fault injection at each point: a failing rank aborts its own side of the case's group before it
reports, and each rank aborts a group once (issue 45); where groups abort (NCCL) a case is held to its
limit; creating and destroying a case's group are bounded by the case's timeout (JobStuck, never a
hang); an NCCL job leaves errors to its own aborts whatever torchrun set. The NCCL side of the same code is
described in the module's docstring: not run on GPUs yet."""

from __future__ import annotations

import os

import job_fault_ranks
import pytest

from bench.launch import launcher
from bench.launch.local import run_on_ranks
from gdn_cp.distributed import Platform


@pytest.mark.multirank
def test_a_failing_rank_aborts_its_group_before_it_reports():
    ranks = run_on_ranks(job_fault_ranks.run_with_fault, 2, ("raise",), timeout_s=60)
    failing = ranks[1]["events"]
    report = failing.index("set case/0/error/1")
    assert "abort" in failing[:report], failing  # its own group first, then the record
    assert all(r["error"] == "rank 1 failed: RuntimeError: injected failure" for r in ranks), ranks
    # issue 45: its own watch then sees the failure it counted, and must not abort the group again (torch
    # raises on a dropped group: a stray traceback from the watch's thread); the peer aborts once too
    for rank, seen in enumerate(ranks):
        assert seen["events"].count("abort") == 1, (rank, seen["events"])
        assert not [e for e in seen["events"] if e.startswith("thread error")], (rank, seen["events"])


@pytest.mark.multirank
def test_where_groups_abort_a_case_past_its_limit_is_aborted_and_fails():
    """Issue 45: under TORCH_NCCL_ASYNC_ERROR_HANDLING=0 nothing ends a collective that never completes but
    the job: each member's watch aborts the case's group at the case's limit, and what the case returns
    after that is void (here it sleeps past the limit outside any collective, then returns)."""
    ranks = run_on_ranks(job_fault_ranks.run_with_fault, 2, ("overrun",), timeout_s=60)
    for rank, seen in enumerate(ranks):
        assert seen["events"].count("abort") == 1, (rank, seen["events"])
        assert seen["results"] is None and seen["error"].startswith("rank "), (rank, seen)
        assert "the case's group was aborted at its limit of 3 s" in seen["error"], seen["error"]


@pytest.mark.multirank
def test_a_group_that_cannot_be_created_is_a_stuck_job_not_a_hang():
    ranks = run_on_ranks(job_fault_ranks.run_with_fault, 2, ("create",), timeout_s=60)
    for rank, seen in enumerate(ranks):
        assert "stuck" in seen, (rank, seen)
        assert f"rank(s) [{rank}] did not finish creating the case's process group" in seen["stuck"]


@pytest.mark.multirank
def test_a_group_that_cannot_be_destroyed_is_a_stuck_job_and_the_case_is_kept():
    ranks = run_on_ranks(job_fault_ranks.run_with_fault, 2, ("destroy",), timeout_s=60)
    assert ranks[0]["results"] == 2.0 and ranks[0]["error"] is None  # rank 0 finished the case
    assert "rank(s) [1] did not finish destroying the case's process group" in ranks[1]["stuck"]


@pytest.mark.parametrize(("rank", "noted"), [(0, True), (3, False)])
def test_an_nccl_job_sets_0_over_what_torchrun_set(monkeypatch, capsys, rank, noted):
    """Issue 45: torch documents _abort_process_group with TORCH_NCCL_ASYNC_ERROR_HANDLING=0, and torchrun's
    agent sets 1 in every worker (under which NCCL's watchdog ends the process, and so the job, on a failed
    case): each rank sets 0 before its first group exists, and rank 0 says what it replaced."""
    monkeypatch.setenv(launcher.NCCL_ERROR_HANDLING, "1")  # what torchrun sets (restored after the test)
    seen = _value_at_init(monkeypatch, Platform("cuda", "nccl"), rank)
    assert seen == "0"
    printed = " ".join(capsys.readouterr().out.split())
    note = "note: TORCH_NCCL_ASYNC_ERROR_HANDLING was 1 (torchrun sets 1 in every rank); this job sets 0"
    assert (note in printed) == noted, printed


def test_a_gloo_job_leaves_the_variable_as_torchrun_set_it(monkeypatch):
    monkeypatch.setenv(launcher.NCCL_ERROR_HANDLING, "1")
    assert _value_at_init(monkeypatch, Platform("cpu", "gloo"), 0) == "1"


def _value_at_init(monkeypatch, platform: Platform, rank: int) -> str | None:
    """TORCH_NCCL_ASYNC_ERROR_HANDLING as a TorchrunLauncher's rank `rank` creates its process group."""
    seen: dict[str, str | None] = {}

    def init_rank_group(platform, timeout) -> None:
        seen["value"] = os.environ.get(launcher.NCCL_ERROR_HANDLING)
        raise RuntimeError("stop before any process group")

    monkeypatch.setattr(launcher, "init_rank_group", init_rank_group)
    job = launcher.TorchrunEnv(rank=rank, world_size=8, local_rank=rank, local_world_size=8)
    runner = launcher.TorchrunLauncher(platform, job, threads_per_rank=1, timeout_s=60)
    with pytest.raises(RuntimeError, match="stop before"), runner.group():
        pass
    return seen["value"]
