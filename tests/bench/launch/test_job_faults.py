"""Issue 35: failure isolation of a torchrun job's cases (bench.launch.job.CaseRunner) on real gloo ranks,
by fault injection at each point: a failing rank aborts its own side of the case's group before it
reports; creating and destroying a case's group are bounded by the case's timeout (JobStuck, never a
hang). The NCCL side of the same code is described in the module's docstring: not run on GPUs yet."""

from __future__ import annotations

import os

import job_fault_ranks
import pytest

from bench.launch import launcher
from gdn_cp.distributed import Platform, run_on_ranks


@pytest.mark.multirank
def test_a_failing_rank_aborts_its_group_before_it_reports():
    ranks = run_on_ranks(job_fault_ranks.run_with_fault, 2, ("raise",), timeout_s=60)
    failing = ranks[1]["events"]
    report = failing.index("set case/0/error/1")
    assert "abort" in failing[:report], failing  # its own group first, then the record
    assert all(r["error"] == "rank 1 failed: RuntimeError: injected failure" for r in ranks), ranks


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


@pytest.mark.parametrize(("given", "expected"), [(None, "0"), ("3", "3")])
def test_an_nccl_job_leaves_errors_to_its_own_abort(monkeypatch, given, expected):
    """torch documents _abort_process_group with TORCH_NCCL_ASYNC_ERROR_HANDLING=0: the job sets it before
    its group exists (a user's own setting is kept)."""
    if given is None:
        monkeypatch.delenv(launcher.NCCL_ERROR_HANDLING, raising=False)
    else:
        monkeypatch.setenv(launcher.NCCL_ERROR_HANDLING, given)
    seen: dict[str, str | None] = {}

    def init_rank_group(platform, timeout) -> None:
        seen["value"] = os.environ.get(launcher.NCCL_ERROR_HANDLING)
        raise RuntimeError("stop before any process group")

    monkeypatch.setattr(launcher, "init_rank_group", init_rank_group)
    job = launcher.TorchrunEnv(rank=0, world_size=8, local_rank=0, local_world_size=8)
    runner = launcher.TorchrunLauncher(Platform("cuda", "nccl"), job, threads_per_rank=1, timeout_s=60)
    with pytest.raises(RuntimeError, match="stop before"), runner.group():
        pass
    assert seen["value"] == expected
