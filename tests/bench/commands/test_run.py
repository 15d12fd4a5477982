"""`bench run`: real 2-rank launches of a tiny scenario, failures recorded, resume, torchrun, user errors."""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import math
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import bench_ranks
import pytest
from conftest import TINY_SCENARIO
from rich.console import Console
from tiny import TINY_LAYER_YAML

from bench.cli import main
from bench.commands import run as run_command
from bench.errors import UserError
from bench.launch.estimate import estimate_peak_bytes
from bench.measure.contention import Window
from bench.results import store
from bench.results.store import clean_rounds, load_result

FIXTURES = Path(__file__).parents[1] / "fixtures"

pytestmark = pytest.mark.multirank


def test_run_writes_a_valid_result_file_then_resume_runs_only_the_rest(suite_dir: Path, capsys):
    out = suite_dir / "out.json"
    # first through the CLI: the cp=1 cases only
    assert main(["run", "tiny", "--filter", "cp=1", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tiny: CP1" in printed and "forward+backward" in printed and "results: out.json" in printed
    assert "GFLOP/s/rank" in printed and "matmul GFLOP/s" in printed  # case lines, then the throughput table
    first = load_result(out)
    assert sorted(c.case.case_id for c in first.cases) == [
        "p2p-ckpt-cp1-T64-fwd_bwd",
        "ulysses-cp1-T64-fwd_bwd",
    ]
    assert first.schedule_seed is not None and first.session is None
    assert first.environment.device_type == "cpu" and first.environment.launcher == "local"
    assert first.scenarios["tiny"]["cp"] == [1, 2] and first.suite.repeat == 2
    assert first.command == ["bench", "run", "tiny", "--filter", "cp=1", "--output", str(out)]

    # resume without the filter: the two cp=2 cases run, the cp=1 ones are kept as they were
    capsys.readouterr()
    assert run_command.run(["tiny"], resume=str(out)) == 0
    assert "resuming out.json: 2 of 4 cases done, 4 of 8 case-rounds" in capsys.readouterr().out
    run = load_result(out)
    assert sorted(c.case.case_id for c in run.cases) == [
        "p2p-ckpt-cp1-T64-fwd_bwd",
        "p2p-ckpt-cp2-T64-fwd_bwd",
        "ulysses-cp1-T64-fwd_bwd",
        "ulysses-cp2-T64-fwd_bwd",
    ]
    assert [run.get(c.key) for c in first.cases] == first.cases  # the cp=1 cases kept as they were
    assert run.schedule_seed == first.schedule_seed  # the resumed run replays the recorded shuffle
    assert run.command == first.command  # the file keeps the command line of the run it began with
    for result in run.cases:
        case = result.case
        assert result.status == "ok" and result.error is None
        # two rounds (bench.yaml's rounds), each its own lifetime of the ranks, every rank's repeats kept
        assert case.rounds == 2 and len(result.rounds) == 2
        assert all(
            len(r.samples_s) == case.cp and all(len(s) == 2 for s in r.samples_s) for r in result.rounds
        )
        assert len(result.samples_s) == case.cp and all(len(s) == 4 for s in result.samples_s)
        assert result.timing.median_s > 0 and result.timing.repeats == 4
        # the estimate: geometric mean of the medians of the rounds the machine was not shared in (all, when
        # it was shared in every one), with an interval from two
        est, used = result.estimate, clean_rounds(result.rounds)
        assert est.rounds == len(used) and (len(used) < 2 or est.low_s < est.median_s < est.high_s)
        assert est.median_s == pytest.approx(math.prod(r.median_s for r in used) ** (1 / len(used)))
        assert len(result.timing.rank_medians_s) == case.cp
        assert result.memory.meter == "cpu-profiler" and len(result.memory.per_rank_bytes) == case.cp
        assert result.memory.peak_bytes == max(result.memory.per_rank_bytes)
        assert all(
            p > b > 0 for p, b in zip(result.memory.per_rank_bytes, result.memory.baseline_bytes, strict=True)
        )
        # the rough estimate is in the measured ballpark (it only has to catch cases that cannot fit)
        assert 0.3 < estimate_peak_bytes(case) / result.memory.peak_bytes < 3
        assert result.wall_s > 0
        # model FLOPs from the one formula, against a measured (positive, finite) matmul limit
        tp = result.throughput
        assert tp.model_flops == case.layer.flops(batch=case.batch, seq_len=case.seq_len, backward=True)
        assert 0 < tp.matmul_gflops < float("inf") and tp.achieved_gflops(result.timing.median_s, case.cp) > 0
        # how shared the machine was: the CPU time other processes took, steal, load (a share, where the
        # window was long enough for /proc/stat's ticks)
        shared = result.contention
        assert shared is not None and shared.load_before is not None
        assert shared.foreign is None or 0 <= shared.foreign <= 1
        assert shared.steal is None or 0 <= shared.steal <= 1

    # everything done: a further resume runs nothing
    assert run_command.run(["tiny"], resume=str(out)) == 0
    assert load_result(out).cases == run.cases


def test_failed_cases_are_recorded_and_the_sweep_goes_on(suite_dir: Path, write_scenario):
    write_scenario("faulty", TINY_LAYER_YAML + "cp: [2]\nseq_len: [32]\nmode: [ulysses, all_gather]\n")
    out = suite_dir / "faulty.json"
    code = run_command.run(
        ["faulty"], sets=["timeout_s=10"], output=str(out), rank_fn=bench_ranks.failing_rank_fn
    )
    assert code == 2  # some cases failed
    results = {r.case.case_id: r for r in load_result(out).cases}
    raised = results["ulysses-cp2-T32-fwd"]
    assert raised.status == "failed" and "RuntimeError: injected failure on rank" in raised.error
    assert raised.error.startswith("rank ") and raised.samples_s is None and raised.timing is None
    died = results["ulysses-cp2-T32-fwd_bwd"]
    assert died.status == "failed" and died.error.startswith("rank 1 failed: exited with code 3")
    # rank 1 sleeps outside any collective while rank 0 waits in a barrier: rank 1 is named, not rank 0
    hung = results["all_gather-ckpt-cp2-T32-fwd"]
    assert hung.status == "failed" and hung.error.startswith("rank 1 failed: stuck:"), hung.error
    assert (
        "rank 1 is busy outside any collective" in hung.error and "rank 0 waits in a collective" in hung.error
    )
    assert all(not r.rounds for r in (raised, died, hung))  # a failed case runs no further rounds
    ok = results["all_gather-ckpt-cp2-T32-fwd_bwd"]
    assert ok.status == "ok" and len(ok.rounds) == 2  # and the sweep went on, both rounds


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
    (node,) = run.environment.nodes
    assert node.node == 0 and node.ranks == 2 and node.git_commit == run.environment.git_commit
    by_id = {r.case.case_id: r for r in run.cases}
    # one job of 2 ranks runs every case up to cp 2: cp 1 on rank 0 (rank 1 waits), cp 2 on both
    for cp in (1, 2):
        result = by_id[f"p2p-ckpt-cp{cp}-T64-fwd_bwd"]
        assert result.status == "ok" and len(result.samples_s) == cp and len(result.rounds) == 2
    assert proc.stdout.count("results: torchrun.json (on ") == 1  # only rank 0 writes and prints
    assert proc.stdout.count(f"writing {out} on ") == 1


def _torchrun_bench(suite_dir: Path, *argv: str) -> subprocess.CompletedProcess:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    command = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "bench", *argv]
    return subprocess.run(command, cwd=suite_dir, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.skipif(
    shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
    reason="no torchrun",
)
def test_under_torchrun_verify_and_profile_run_every_cp_up_to_the_job(suite_dir: Path):
    """Issue 35: like `bench run`, one job of 2 ranks checks cp 1 (rank 0, rank 1 waiting) and cp 2, each
    case in a group of its own, instead of skipping the cases whose cp is not the job's size."""
    out = suite_dir / "verify.json"
    # fp32 bars with power (the reference PR's bf16 bars let a 1% state error through: exit 4, "no power")
    scenario = suite_dir / "scenarios" / "tiny.yaml"
    bars = "thresholds: {fp32: {rel_l2: 1.0e-4, train_first_gdn_output_rel_l2: 1.0e-4}}"
    scenario.write_text(scenario.read_text() + bars + "\n")
    proc = _torchrun_bench(suite_dir, "verify", "tiny", "--set", "mode=[p2p]", "--output", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {v.case.cp: v for v in load_result(out).verifications}
    assert sorted(records) == [1, 2] and all(v.passed for v in records.values()), records
    train = "train: {vocab_size: 64, intermediate_size: 64, num_attention_heads: 2, num_key_value_heads: 1}"
    scenario.write_text(scenario.read_text() + train + "\n")
    out = suite_dir / "train.json"
    proc = _torchrun_bench(
        suite_dir, "verify", "tiny", "--set", "mode=[p2p]", "--train", "3", "--output", str(out)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trained = {v.case.cp: v for v in load_result(out).verifications}
    assert sorted(trained) == [1, 2] and all(v.passed for v in trained.values()), trained
    proc = _torchrun_bench(
        suite_dir,
        "profile",
        "tiny",
        "--case",
        "mode=p2p,cp=1",
        "--steps",
        "1",
        "--output",
        str(suite_dir / "p"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (suite_dir / "p").exists() and list((suite_dir / "p").rglob("rank0.json"))


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


def test_resume_counts_the_rounds_already_done(suite_dir: Path, capsys):
    """A run stopped after its first round has no case complete, but half its case-rounds: say both."""
    out = suite_dir / "out.json"
    assert run_command.run(["tiny"], filters=["cp=1"], output=str(out), stop_after_round=1) == 0
    capsys.readouterr()
    # every view of the stopped run says so (issue 37: show said nothing of the rounds still to run)
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "incomplete: 2 of 2 cases incomplete: 2 of 4 rounds measured" in " ".join(shown.split())
    assert run_command.run(["tiny"], filters=["cp=1"], resume=str(out)) == 0
    assert "resuming out.json: 0 of 2 cases done, 2 of 4 case-rounds" in capsys.readouterr().out
    assert main(["show", str(out)]) == 0 and "incomplete" not in capsys.readouterr().out


def test_a_full_disk_stops_the_run_and_keeps_what_was_saved(suite_dir: Path, capsys, monkeypatch):
    """ENOSPC on the third write: one red line (where the results are, why, the resume command), exit 1; the
    file holds the two saved case-rounds, loads, and the printed command finishes the run."""
    out = suite_dir / "out.json"
    real_fsync, writes = store.os.fsync, []

    def fsync(fd: int) -> None:
        writes.append(fd)
        if len(writes) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(store.os, "fsync", fsync)
    assert main(["run", "tiny", "--filter", "cp=1", "--output", str(out)]) == 1
    err = " ".join(_without_busy_warning(capsys.readouterr().err).split())
    assert err.startswith(f"error: cannot write {out}: No space left on device: the run stopped; out.json ")
    assert "holds the 1 case result saved before (the file is whole;" in err  # the file, then one case-round
    assert err.endswith("then continue with `bench run tiny --filter cp=1 --resume out.json`")
    assert not list(suite_dir.glob(".out.json.*.tmp"))  # the temporary file of the failed write is gone
    kept = load_result(out)
    assert len(kept.cases) == 1 and len(kept.cases[0].rounds) == 1
    monkeypatch.setattr(store.os, "fsync", real_fsync)
    assert main(["run", "tiny", "--filter", "cp=1", "--resume", str(out)]) == 0
    assert all(len(c.rounds) == 2 for c in load_result(out).cases) and len(load_result(out).cases) == 2


def test_resume_refuses_a_changed_scenario(suite_dir: Path):
    out = suite_dir / "r.json"
    (suite_dir / "r.json").write_text(json.dumps({}))
    with pytest.raises(UserError, match="schema_version None"):
        run_command.run(["tiny"], resume=str(out))
    # a result file of the same scenario with other sweep lists
    from bench.results.store import save_result
    from tests.bench.results.test_store import new_run  # a valid, empty run of scenario "s"

    run = new_run()
    run.scenarios = {"tiny": {"cp": [4]}}
    save_result(run, out)
    with pytest.raises(UserError, match=r"scenario tiny differs from the one this file ran \(.*cp.*\)"):
        run_command.run(["tiny"], resume=str(out))


def test_scenarios_naming_different_devices_are_refused(suite_dir: Path, write_scenario):
    write_scenario("other", (suite_dir / "scenarios" / "tiny.yaml").read_text() + "device: cuda\n")
    with pytest.raises(UserError, match=r"scenarios tiny \(cpu\), other \(cuda\) name different devices"):
        run_command.run(["tiny", "other"])


# result files are never lost or mislabelled


def _stored_run(suite_dir: Path, **env_changes) -> Path:
    """A result file of `tiny` as this machine would start it, its environment changed by `env_changes`."""
    from bench.results.store import save_result
    from tests.bench.results.test_store import new_run

    run = new_run()
    run.name = "tiny"
    run.environment = dataclasses.replace(run.environment, **env_changes)
    run.scenarios = {}
    path = suite_dir / "before.json"
    save_result(run, path)
    return path


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"git_commit": "0" * 40}, "git_commit '00000000' -> "),
        ({"git_dirty": None}, "git_dirty "),  # None: the opposite of this checkout's state
        ({"threads_per_rank": 7}, "threads_per_rank 7 -> None"),
        ({"hostname": "elsewhere"}, "hostname 'elsewhere' -> "),
    ],
)
def test_resume_refuses_a_file_of_another_commit_dirty_state_threads_or_host(suite_dir: Path, change, named):
    if change.get("git_dirty", 0) is None:
        change = {"git_dirty": not load_result(_stored_run(suite_dir)).environment.git_dirty}
    path = _stored_run(suite_dir, **change)
    before = path.read_text()
    with pytest.raises(UserError) as info:
        run_command.run(["tiny"], resume=str(path))
    message = str(info.value)
    assert (
        message.startswith(f"{path}: was run with another environment than this run's (") and named in message
    )
    assert "resume it where it ran, or start a new run without --resume" in message
    assert path.read_text() == before


def test_resume_refuses_a_verify_file(suite_dir: Path):
    path = _stored_run(suite_dir)
    run = load_result(path)
    run.name = "verify-tiny"  # as `bench verify tiny` names it, before its first record
    run.scenarios = {"tiny": {}}
    from bench.results.store import save_result

    save_result(run, path)
    with pytest.raises(UserError, match="holds `bench verify` records, not `bench run` timings"):
        run_command.run(["tiny"], resume=str(path))


def test_an_existing_output_is_never_overwritten(suite_dir: Path, capsys):
    out = suite_dir / "taken.json"
    out.write_text("precious\n")
    assert main(["run", "tiny", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the file exists, and result files are never overwritten; continue that run with --resume" in err
    assert err.count("\n") == 1 and out.read_text() == "precious\n"


def test_default_result_names_never_collide(suite_dir: Path, monkeypatch):
    from bench.commands import session

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(session.datetime, "datetime", Frozen)  # two runs started in the same second
    opened = session.Session.open(session.CaseChoice(["tiny"], device="cpu"), Console(quiet=True))
    first, second = (opened.result_writer(None, "tiny").path for _ in range(2))
    assert first != second and second.name == first.name.replace(".json", "-2.json")
    assert first.name.startswith("20260102-030405-") and first.is_file() and second.is_file()


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (".", "--output .: is a folder; give a file name, e.g. --output result.json"),
        (
            "bench.yaml/out.json",
            "--output bench.yaml/out.json: cannot write a result file there (a folder above",
        ),
    ],
)
def test_output_a_folder_or_unwritable_is_one_line_before_anything_starts(
    suite_dir: Path, capsys, output, message
):
    assert main(["run", "tiny", "--output", output]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}"), err
    assert err.count("\n") == 1


def test_two_scenarios_of_one_name_are_refused(suite_dir: Path):
    for folder in ("a", "b"):
        (suite_dir / folder).mkdir()
        (suite_dir / folder / "x.yaml").write_text((suite_dir / "scenarios" / "tiny.yaml").read_text())
    with pytest.raises(
        UserError, match=r"a/x.yaml and b/x.yaml: both are scenario 'x' \(a scenario is named"
    ):
        run_command.run(["a/x.yaml", "b/x.yaml"])
    with pytest.raises(UserError, match=r"scenario 'tiny': given twice \(as tiny and scenarios/tiny.yaml\)"):
        run_command.run(["tiny", "scenarios/tiny.yaml"])


def test_usage_errors_exit_1_and_help_exits_0(suite_dir: Path, capsys):
    assert main(["run", "--bogus"]) == 1
    err = capsys.readouterr().err
    assert err == "error: bench run: unrecognized arguments: --bogus; see `bench run --help`\n"
    assert main(["verify", "tiny", "--seeds", "many"]) == 1
    assert "error: bench verify: argument --seeds: invalid int value: 'many'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["run", "--help"])
    assert info.value.code == 0


def test_the_resume_command_after_ctrl_c_really_resumes(suite_dir: Path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_command, "_run_with_progress", interrupted)
    console = Console(width=400, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    out = suite_dir / "out put.json"
    code = run_command.run(
        ["scenarios/tiny.yaml"],
        sets=["repeat=1", "mode=[p2p]"],
        filters=["cp=1"],
        device="cpu",
        output=str(out),
        console=console,
    )
    assert code == 130
    printed = " ".join(console.export_text().split())
    again = (
        "bench run scenarios/tiny.yaml --set repeat=1 --set 'mode=[p2p]' --filter cp=1 --device cpu "
        "--resume 'out put.json'"
    )
    assert f"continue with `{again}`" in printed
    assert "interrupted: out put.json holds no measurement yet (no case-round finished)" in printed
    # and it resumes: the same scenarios and overrides pass the resume's checks (no case is run here)
    monkeypatch.setattr(run_command, "_run_with_progress", lambda *args, **kwargs: [])
    assert main(shlex.split(again)[1:]) == 0


TWO_NODES = TINY_SCENARIO.replace("cp: [1, 2]", "cp: [1, 2, 4]").replace(
    "mode: [ulysses, p2p]", "mode: [p2p, scan]"
)
"""A cp 1 / 2 / 4 sweep for one job of two simulated nodes (ulysses' 2 key heads do not split over 4)."""


@pytest.mark.skipif(
    shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
    reason="no torchrun",
)
def test_two_torchrun_nodes_sweep_every_cp_in_one_job(suite_dir: Path):
    """Issue 20: two torchrun agents on 127.0.0.1 as two nodes of 2 ranks. One 4-rank job runs every case of
    a cp [1, 2, 4] scenario (cp < 4 in groups of their own); one file holds both nodes' environments and
    every case; a case that fails on one rank outside any collective fails alone, within its limit plus a
    few seconds, and the sweep goes on."""
    (suite_dir / "scenarios" / "two-nodes.yaml").write_text(TWO_NODES)
    out = suite_dir / "job.json"
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parents[1] / "faulty_site"), env.get("PYTHONPATH", "")]
    )
    env["BENCH_TEST_FAIL"] = "scan-ckpt-cp2-T64-fwd_bwd@1"
    argv = [torchrun, "--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    argv += ["--master-port", str(port)]
    bench_argv = ["-m", "bench", "run", "two-nodes", "--set", "timeout_s=10", "--output", str(out)]
    agents = [
        subprocess.Popen(
            [*argv, "--node-rank", str(node), *bench_argv],
            cwd=suite_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = []
    for agent in agents:
        try:
            outputs.append(agent.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for a in agents:
                a.kill()
            raise
    # rank 0 exits 2 (a case failed, recorded; the rest ran), which its agent reports; the others exit 0
    assert [a.returncode for a in agents] == [1, 0], outputs
    assert "exitcode  : 2" in outputs[0] and "local_rank: 0" in outputs[0], outputs[0]
    run = load_result(out)
    assert [(n.node, n.ranks) for n in run.environment.nodes] == [(0, 2), (1, 2)]
    by_id = {r.case.case_id: r for r in run.cases}
    assert sorted(by_id) == sorted(
        f"{m}-ckpt-cp{cp}-T64-fwd_bwd" for m in ("p2p", "scan") for cp in (1, 2, 4)
    )
    broken = by_id.pop("scan-ckpt-cp2-T64-fwd_bwd")
    assert broken.status == "failed"
    assert broken.error.startswith("rank 1 failed: ValueError: scan-ckpt-cp2-T64-fwd_bwd broke on purpose")
    assert broken.wall_s < 10 + 15  # its limit, then the end-of-case barrier's margin
    for result in by_id.values():
        assert result.status == "ok", result.error
        assert len(result.samples_s) == result.case.cp and len(result.rounds) == 2
    assert outputs[0].count("results: job.json (on ") == 1 and "results:" not in outputs[1]


def _without_busy_warning(err: str) -> str:
    """stderr without the busy-machine warning a loaded test machine gets at the start of a run."""
    return "\n".join(line for line in err.splitlines() if not line.startswith("warning: busy machine"))


def test_a_run_opens_with_what_it_will_do_and_a_busy_machine_is_said_first(
    suite_dir: Path, capsys, monkeypatch
):
    """Issue 37: `bench run` printed no opening line and gave no warning up front on a busy machine;
    --require-idle refuses to start there, leaving no file of an empty run."""
    busy = Window(busy_s=1.6, own_s=0.0, steal_s=0.0, total_s=2.0)  # others took 80% of 2 CPU-seconds
    monkeypatch.setattr(run_command, "probe", lambda: busy)
    out = suite_dir / "idle.json"
    with pytest.raises(UserError, match=r"--require-idle: the machine is busy \(others took 80% of the CPU"):
        run_command.run(filters=["cp=1"], output=str(out), require_idle=True)
    assert not out.exists()
    assert run_command.run(filters=["cp=1"], output=str(out)) == 0
    captured = capsys.readouterr()
    assert "warning: busy machine: others took 80% of the CPU" in captured.err
    opening = next(line for line in captured.out.splitlines() if line.startswith("running "))
    assert opening.startswith("running 2 cases x up to 2 rounds (4 case-rounds) of tiny on cpu (gloo)")
    assert "results in idle.json" in " ".join(captured.out.split())


def test_an_interrupt_says_what_the_file_keeps():
    """Issue 46: "finished cases are in FILE" after an interrupt when no case had all its rounds; the file
    keeps the rounds of partly measured cases, which a resume does not run again: the line says so."""
    run = load_result(FIXTURES / "ablation.json")  # 11 ok cases of one round, one failed
    wanting = [dataclasses.replace(c, case=dataclasses.replace(c.case, rounds=3)) for c in run.cases]
    partly = dataclasses.replace(run, cases=wanting)
    assert run_command.kept_summary(partly, "f.json") == (
        "f.json keeps 11 rounds of 11 partly measured cases, 1 failed or skipped case"
    )
    assert (
        run_command.kept_summary(run, "f.json") == "f.json keeps 11 finished cases, 1 failed or skipped case"
    )
    mixed = dataclasses.replace(run, cases=[*run.cases[:2], *wanting[2:4]])
    assert run_command.kept_summary(mixed, "f.json") == (
        "f.json keeps 2 finished cases, 2 rounds of 2 partly measured cases"
    )
    empty = dataclasses.replace(run, cases=[])
    assert (
        run_command.kept_summary(empty, "f.json")
        == "f.json holds no measurement yet (no case-round finished)"
    )


def _measured_from_fixture(monkeypatch) -> None:
    """`bench run`'s rounds replaced by the ablation fixture's results, written as the sweep writes them:
    what the run does after its cases (tables, results line, charts) runs on them, no rank started."""
    measured = load_result(FIXTURES / "ablation.json").cases

    def sweep(cases, launcher, record, console, start, stop_after, opening=None):
        for result in measured:
            start.writer.add(result)
        return measured

    monkeypatch.setattr(run_command, "_run_with_progress", sweep)


def test_bench_run_ends_with_its_charts_beside_the_result_file(suite_dir: Path, monkeypatch, capsys):
    """Issue 46: `bench run` drew no chart while the README's first screen shows one. The main job ends with
    its charts in a new folder the result file names (never the committed plots/); --no-plots skips them,
    and so does a run stopped after a round (one side of `bench compare`)."""
    _measured_from_fixture(monkeypatch)
    (suite_dir / "plots").mkdir()
    assert main(["run", "--output", "first.json"]) == 2  # the fixture has a failed case: charts all the same
    out = " ".join(capsys.readouterr().out.split())
    charts = suite_dir / "first-charts"
    assert sorted(p.name for p in charts.glob("*.png")) == [
        "checkpoint_summary.png",
        "comm_vs_seq.png",
        "strong_scaling.png",
    ]
    assert "charts: first-charts (3, e.g." in out and list((suite_dir / "plots").iterdir()) == []
    assert main(["run", "--output", "second.json", "--no-plots"]) == 2
    assert not (suite_dir / "second-charts").exists() and "charts:" not in capsys.readouterr().out
    assert main(["run", "--output", "third.json", "--stop-after-round", "1"]) == 2
    assert not (suite_dir / "third-charts").exists()
