"""`bench doctor`: the host check runs on real ranks here (cpu, 2 ranks), names each problem in one line,
keeps the worst rank's verdict per check, and exits 2 when a check failed."""

from __future__ import annotations

import os

import doctor_fault_ranks
import pytest
import torch
from rich.console import Console

from bench.cli import main
from bench.commands import doctor
from bench.doctor import system
from bench.doctor.checks import Check
from bench.doctor.kernels import layer_backends
from bench.launch.local import run_on_ranks
from bench.measure.contention import Window

pytestmark = pytest.mark.multirank


def _console() -> Console:
    return Console(width=200, record=True, file=open(os.devnull, "w"))


def test_doctor_on_cpu_checks_every_part(monkeypatch):
    monkeypatch.setattr(system, "probe", lambda s: Window(busy_s=0.01, own_s=0.0, steal_s=0.0, total_s=2.0))
    console = _console()
    assert doctor.run(device="cpu", console=console) == 0
    text = console.export_text()
    for line in ("all-reduce", "all-to-all", "isend/irecv ring", "limit fp32", "chunk vs recurrent, packed"):
        assert line in text
    assert "gdn_cp seam" in text and "fla" in text  # fla: checked, or one line saying why not
    backends = 1 + len(layer_backends(torch.device("cpu")))  # transformers' fallback where it is installed
    rows = [r for r in text.splitlines() if r.startswith("│ layer")]
    training = [r for r in rows if "prefill" not in r]
    prefill = [r for r in rows if "prefill" in r]  # output, conv and recurrent states against one device
    assert len(training) == 4 * backends, rows
    assert all("│ ok " in r and "cp 2: output rel-L2" in r for r in training), rows
    assert len(prefill) == 4 * backends and all("│ ok " in r and "conv state" in r for r in prefill), rows
    assert "verdict: ok" in text or "verdict: warn" in text  # a governor or boost may warn on some hosts


def test_a_check_that_fails_on_one_rank_fails_on_every_rank_and_the_rest_run():
    """Issue 45: rank 1's layer check under p2p raises before its first collective while rank 0 is inside
    it. Each check runs in a group of its own, its outcome agreed through the store: both ranks' p2p row
    fails naming rank 1's error (rank 0 leaves the collective at the check's limit on gloo; NCCL aborts it),
    and every other row, p2p's prefill and the later modes included, runs in step and passes."""
    ranks = run_on_ranks(doctor_fault_ranks.distributed_checks_with_a_failure, 2, ("p2p",), timeout_s=60)
    for rank, (rows, thread_errors) in enumerate(ranks):
        by_name = {name: (status, detail) for name, status, detail in rows}
        assert by_name.pop("p2p") == ("fail", "rank 1 failed: RuntimeError: injected failure in p2p"), rank
        assert all(status == "ok" for status, _ in by_name.values()), (rank, by_name)
        assert {"broadcast", "p2p prefill", "all_gather", "scan prefill"} <= set(by_name), rank
        assert thread_errors == [], (rank, thread_errors)


def test_a_busy_machine_is_named_in_one_line(monkeypatch):
    busy = Window(busy_s=1.2, own_s=0.0, steal_s=0.0, total_s=2.0)  # others took 60% of 2 cores for 1 s
    monkeypatch.setattr(system, "probe", lambda s: busy)
    (check,) = system.load()
    assert check.status == "warn" and check.detail.startswith("busy machine: others took 60% of the CPU")


def test_the_worst_rank_decides_and_a_failure_exits_2(monkeypatch):
    ok = Check("layer", "p2p", "ok", "cp 2: fine")
    bad = Check("layer", "p2p", "fail", "output.rel_l2 3.1e-01 > 1.0e-03")
    monkeypatch.setattr(doctor, "run_on_ranks", lambda *a, **k: [[ok], [bad]])
    monkeypatch.setattr(doctor, "system_checks", list)
    checks, world = doctor.device_checks("cpu", 60)
    assert world == doctor.CPU_RANKS and checks == [Check("layer", "p2p", "fail", f"rank 1: {bad.detail}")]
    console = _console()
    assert doctor.run(device="cpu", console=console) == doctor.EXIT_FAILED == 2
    assert "fail: layer / p2p: rank 1: output.rel_l2 3.1e-01 > 1.0e-03" in console.export_text()


def test_a_device_that_is_not_there_is_one_red_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a host without a GPU, wherever it runs
    assert main(["doctor", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: device 'cuda': no GPU visible to torch") and err.count("\n") == 1
