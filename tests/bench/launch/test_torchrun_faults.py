"""Issue 45: under torchrun itself (`--nproc-per-node 2`, gloo), with the environment torchrun's agent gives
its workers (TORCH_NCCL_ASYNC_ERROR_HANDLING=1 among it, untouched by this test), a case that raises on one
rank fails alone and the job goes on to the next case. The NCCL side (each rank sets the variable to 0
before its first group) is tests/bench/launch/test_job_faults.py's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.results.store import load_result

TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")


@pytest.mark.multirank
@pytest.mark.skipif(not Path(TORCHRUN).exists(), reason="no torchrun")
def test_a_case_that_raises_on_one_rank_fails_alone_under_torchrun(suite_dir: Path):
    out = suite_dir / "job.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parent / "torchrun_site"), env.get("PYTHONPATH", "")]
    )
    env["BENCH_TEST_FAIL"] = "ulysses-cp2-T64-fwd_bwd@1"
    command = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "bench", "run", "tiny"]
    command += ["--filter", "cp=2", "--set", "timeout_s=10", "--set", "rounds=1", "--output", str(out)]
    proc = subprocess.run(command, cwd=suite_dir, env=env, capture_output=True, text=True, timeout=240)
    # rank 0 exits 2 (a case failed, recorded, the rest ran), which torchrun's agent reports as its failure
    assert proc.returncode == 1 and "exitcode  : 2" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    by_id = {r.case.case_id: r for r in load_result(out).cases}
    broken = by_id.pop("ulysses-cp2-T64-fwd_bwd")
    assert broken.status == "failed"
    # the rank ran with torchrun's value: gloo leaves it alone, and the case still failed alone
    assert broken.error == "rank 1 failed: ValueError: broke on purpose (TORCH_NCCL_ASYNC_ERROR_HANDLING=1)"
    (ran,) = by_id.values()
    assert ran.case.case_id == "p2p-ckpt-cp2-T64-fwd_bwd" and ran.status == "ok", ran.error
    assert len(ran.samples_s) == 2 and len(ran.rounds) == 1
