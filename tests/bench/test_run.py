"""`bench run`: real 2-rank launches of a tiny scenario, failures recorded, resume, torchrun, user errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import bench_ranks
import pytest

from bench.cli import main
from bench.commands import run as run_command
from bench.errors import UserError
from bench.launch.estimate import estimate_peak_bytes
from bench.results.store import load_result

pytestmark = pytest.mark.multirank


def test_run_writes_a_valid_result_file_then_resume_runs_only_the_rest(suite_dir: Path, capsys):
    out = suite_dir / "out.json"
    # first through the CLI: the cp=1 cases only
    assert main(["run", "tiny", "--filter", "cp=1", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tiny: CP1" in printed and "forward+backward median" in printed and "results: out.json" in printed
    first = load_result(out)
    assert [c.case.case_id for c in first.cases] == ["ulysses-cp1-T64-fwd_bwd", "p2p-ckpt-cp1-T64-fwd_bwd"]
    assert first.environment.device_type == "cpu" and first.environment.launcher == "local"
    assert first.scenarios["tiny"]["cp"] == [1, 2] and first.suite["repeat"] == 2

    # resume without the filter: the two cp=2 cases run, the cp=1 ones are kept as they were
    assert run_command.run(["tiny"], resume=str(out)) == 0
    run = load_result(out)
    assert [c.case.case_id for c in run.cases] == [
        "ulysses-cp1-T64-fwd_bwd",
        "p2p-ckpt-cp1-T64-fwd_bwd",
        "ulysses-cp2-T64-fwd_bwd",
        "p2p-ckpt-cp2-T64-fwd_bwd",
    ]
    assert run.cases[:2] == first.cases
    for result in run.cases:
        case = result.case
        assert result.status == "ok" and result.error is None
        assert len(result.samples_s) == case.cp and all(len(s) == case.repeat == 2 for s in result.samples_s)
        assert result.timing.median_s > 0 and result.timing.repeats == 2
        assert len(result.timing.rank_medians_s) == case.cp
        assert result.memory.meter == "cpu-profiler" and len(result.memory.per_rank_bytes) == case.cp
        assert result.memory.peak_bytes == max(result.memory.per_rank_bytes)
        assert all(
            p > b > 0 for p, b in zip(result.memory.per_rank_bytes, result.memory.baseline_bytes, strict=True)
        )
        # the rough estimate is in the measured ballpark (it only has to catch cases that cannot fit)
        assert 0.3 < estimate_peak_bytes(case) / result.memory.peak_bytes < 3
        assert result.wall_s > 0

    # everything done: a further resume runs nothing
    assert run_command.run(["tiny"], resume=str(out)) == 0
    assert load_result(out).cases == run.cases


def test_failed_cases_are_recorded_and_the_sweep_goes_on(suite_dir: Path, write_scenario):
    write_scenario(
        "faulty",
        """\
        hidden_size: 32
        num_k_heads: 2
        num_v_heads: 4
        head_k_dim: 8
        head_v_dim: 8
        chunk_size: 8
        cp: [2]
        seq_len: [32]
        mode: [ulysses, all_gather]
        """,
    )
    out = suite_dir / "faulty.json"
    code = run_command.run(
        ["faulty"], sets=["timeout_s=5"], output=str(out), rank_fn=bench_ranks.failing_rank_fn
    )
    assert code == 2  # some cases failed
    results = {r.case.case_id: r for r in load_result(out).cases}
    raised = results["ulysses-cp2-T32-fwd"]
    assert raised.status == "failed" and "RuntimeError: injected failure on rank" in raised.error
    assert raised.error.startswith("rank ") and raised.samples_s is None and raised.timing is None
    assert results["ulysses-cp2-T32-fwd_bwd"].status == "failed"  # a rank died
    assert results["all_gather-ckpt-cp2-T32-fwd"].status == "failed"  # a collective timed out
    assert results["all_gather-ckpt-cp2-T32-fwd_bwd"].status == "ok"  # and the sweep went on


@pytest.mark.skipif(
    shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
    reason="no torchrun",
)
def test_under_torchrun_each_process_is_a_rank(suite_dir: Path):
    out = suite_dir / "torchrun.json"
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "bench",
            "run",
            "tiny",
            "--set",
            "mode=[p2p]",
            "--output",
            str(out),
        ],
        cwd=suite_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = load_result(out)
    assert run.environment.launcher == "torchrun"
    by_id = {r.case.case_id: r for r in run.cases}
    assert by_id["p2p-ckpt-cp1-T64-fwd_bwd"].status == "skipped"
    assert "this torchrun job has 2" in by_id["p2p-ckpt-cp1-T64-fwd_bwd"].error
    ok = by_id["p2p-ckpt-cp2-T64-fwd_bwd"]
    assert ok.status == "ok" and len(ok.samples_s) == 2
    assert proc.stdout.count("results: torchrun.json") == 1  # only rank 0 writes and prints


# user errors: one line, exit code 1, before any rank starts


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "nope"], "error: scenario 'nope': no scenarios/nope.yaml"),
        (
            ["run", "--set", "mode=[ring]"],
            "error: scenarios/tiny.yaml (--set mode=[ring]): mode: unknown mode 'ring'",
        ),
        (["run", "--device", "tpu"], "error: bench.yaml (--device tpu): device: unknown device 'tpu'"),
        (["run", "--device", "npu"], "error: device 'npu' needs torch-npu"),
        (["run", "--filter", "cp=3"], "error: --filter cp=3 matches none of the 4 cases of tiny"),
        (["run", "--output", "a.json", "--resume", "b.json"], "error: --output and --resume given together"),
        (["run", "--resume", "missing.json"], "error: missing.json: no such result file"),
        (["show", "missing.json"], "error: missing.json: no such result file"),
    ],
)
def test_user_errors_are_one_red_line(suite_dir: Path, capsys, argv, message):
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(message), captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_resume_refuses_a_changed_scenario(suite_dir: Path):
    out = suite_dir / "r.json"
    (suite_dir / "r.json").write_text(json.dumps({}))
    with pytest.raises(UserError, match="schema_version None"):
        run_command.run(["tiny"], resume=str(out))
    # a result file of the same scenario with other sweep lists
    from test_store import new_run  # a valid, empty run of scenario "s"

    from bench.results.store import save_result

    run = new_run()
    run.scenarios = {"tiny": {"cp": [4]}}
    save_result(run, out)
    with pytest.raises(UserError, match=r"scenario tiny differs from the one this file ran \(.*cp.*\)"):
        run_command.run(["tiny"], resume=str(out))


def test_scenarios_naming_different_devices_are_refused(suite_dir: Path, write_scenario):
    write_scenario("other", (suite_dir / "scenarios" / "tiny.yaml").read_text() + "device: cuda\n")
    with pytest.raises(UserError, match=r"scenarios tiny \(cpu\), other \(cuda\) name different devices"):
        run_command.run(["tiny", "other"])
