"""The correctness gate (bench.measure.gate): what ran is recorded and checked against the case, and a wrong
output is never timed. Each way a program can differ from its name is made on purpose (tests/bench/gate_site
replaces a backend's op in every process of a real `bench run`) and seen to fail its case with one line.
A backend's first use (compiles, autotuning) sits in the first pass, apart from every figure."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny import TINY_LAYER, TINY_LAYER_YAML

from bench.measure.gate import (
    GATE_REL_L2,
    Fingerprints,
    fingerprint_difference,
    gate_bar,
    ran_problems,
    sketch,
    small_cut,
    token_rows,
)
from bench.measure.inputs import local_ranges
from bench.results.store import load_result
from bench.suite.config import Case
from gdn_cp.ops.ran import OpRan, Ran, Recording

OP_SITE = Path(__file__).parents[1] / "op_site"


def _case(**fields) -> Case:
    base = dict(
        scenario="s", mode="p2p", checkpoint=True, cp=2, seq_len=64, pass_="forward_backward",
        layer=TINY_LAYER, batch=1, seed=0, warmup=1, repeat=1,
    )  # fmt: skip
    return Case(**{**base, **fields})


def _recording(case: Case, **call_fields) -> Recording:
    options = case.options
    call = Ran(
        call="GatedDeltaNet",
        mode=options.mode,
        mode_class="gdn_cp.distributed.modes.p2p.P2PMode",
        layout=options.layout,
        checkpoint_summary=options.checkpoint_summary,
        overlap=options.overlap,
        local_path="recompute",
        chunk_size=case.layer.chunk_size,
        dtype=case.dtype,
        precision="fp32",
        ops=[OpRan(backend=case.backend, op="gdn_cp.ops.chunk.rule.chunk_gated_delta_rule")],
    )
    return Recording(calls=[dataclasses.replace(call, **call_fields)])


def test_what_ran_is_checked_against_the_case():
    case = _case()
    assert ran_problems(case, _recording(case), "cpu") == []
    assert ran_problems(case, None, "cpu") == []  # an older gdn_cp records nothing: not a failure
    assert ran_problems(case, _recording(case, mode="scan"), "cpu") == ["asked mode p2p, ran mode scan"]
    assert ran_problems(case, _recording(case, overlap=True), "cpu") == [
        "asked overlap False, ran overlap True"
    ]
    # transformers rebinding its fallback to FLA's kernel: named, with what to do
    swapped = _case(layer=dataclasses.replace(TINY_LAYER, backend="transformers"))
    fla = OpRan(backend="transformers", op="fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule")
    (line,) = ran_problems(swapped, _recording(swapped, ops=[fla]), "cpu")
    assert line.startswith("asked backend transformers, ran fla.ops.gated_delta_rule.chunk.chunk_gated_delta")
    assert "transformers switches to FLA's kernel when fla imports" in line and "backend=fla" in line
    other = OpRan(backend="fla", op="fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule")
    (line,) = ran_problems(case, _recording(case, ops=[other]), "cpu")
    assert line.startswith("asked backend gdn_cp, ran backend fla")
    # the CPU has no TF32 mode: a tf32 case runs fp32 there, and that is what it asked for
    tf32 = _case(precision="tf32")
    assert ran_problems(tf32, _recording(tf32), "cpu") == []
    assert ran_problems(tf32, _recording(tf32), "cuda") == ["asked precision tf32, ran precision fp32"]


def test_fingerprints_add_up_over_ranks_and_estimate_the_relative_error():
    """Every rank's sketch of its rows sums to the sketch of the whole tensor, whatever the cp and layout;
    two fingerprints' relative L2 difference estimates the tensors' (32 numbers: within about 2x)."""
    generator = torch.Generator().manual_seed(0)
    whole = torch.randn(2, 64, 32, generator=generator, dtype=torch.float64)
    full = sketch(whole, token_rows([(0, 64)], 2, 64), 0)
    for cp, layout in ((2, "contiguous"), (4, "zigzag")):
        parts = []
        for rank in range(cp):
            ranges = local_ranges(64, cp, rank, layout)
            shard = torch.cat([whole[:, lo:hi] for lo, hi in ranges], dim=1)
            parts.append(sketch(shard, token_rows(ranges, 2, 64), 0))
        torch.testing.assert_close(sum(parts), full, rtol=1e-12, atol=1e-9)
    for rel in (1e-3, 1e-1):
        noise = torch.randn(whole.shape, generator=generator, dtype=torch.float64)
        other = whole + rel * whole.norm() / noise.norm() * noise
        a = Fingerprints(o=sketch(other, token_rows([(0, 64)], 2, 64), 0).tolist())
        name, estimate = fingerprint_difference(a, Fingerprints(o=full.tolist()))
        assert name == "o" and rel / 3 < estimate < rel * 3
    nan = Fingerprints(o=[math.nan] * 32)
    assert fingerprint_difference(nan, Fingerprints(o=full.tolist()))[1] == math.inf


def test_the_bar_follows_the_precision_and_the_small_input_follows_the_layout():
    assert gate_bar(_case()) == GATE_REL_L2["fp32"]
    assert gate_bar(_case(precision="tf32")) == GATE_REL_L2["tf32"]
    bf16 = dataclasses.replace(TINY_LAYER, dtype=torch.bfloat16)
    assert gate_bar(_case(layer=bf16, precision="tf32")) == GATE_REL_L2["bf16"]
    assert small_cut(_case()) == (16, None)  # one chunk of 8 a piece, 2 pieces
    assert small_cut(_case(cp=4, layout="zigzag")) == (64, None)


SCENARIO = f"""\
description: the gate's test
{TINY_LAYER_YAML}warmup: 1
repeat: 1
rounds: 1
cp: [1, 2]
seq_len: [64]
mode: [p2p]
checkpoint: [true]
pass: [forward_backward]
"""


def _run_with(op: str, tmp_path: Path, extra: str = "") -> tuple[subprocess.CompletedProcess, dict]:
    """`bench run` of SCENARIO (+ extra lines) with BENCH_TEST_OP=op in every process; (process, results
    by case id)."""
    (tmp_path / "gate.yaml").write_text(SCENARIO + extra)
    out = tmp_path / "out.json"
    env = {**os.environ, "BENCH_TEST_OP": op}
    env["PYTHONPATH"] = os.pathsep.join([str(OP_SITE), env.get("PYTHONPATH", "")])
    argv = ["run", str(tmp_path / "gate.yaml"), "--device", "cpu", "--set", "timeout_s=120", "--output"]
    done = subprocess.run(
        [sys.executable, "-m", "bench", *argv, str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = {r.case.case_id: r for r in load_result(out).cases} if out.exists() else {}
    return done, results


@pytest.mark.multirank
def test_a_backend_that_returns_nan_is_failed_never_timed(tmp_path: Path):
    done, results = _run_with("nan", tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    for result in results.values():
        assert result.status == "failed" and not result.rounds and result.estimate is None
        assert "outputs are not finite: o is not finite on rank" in result.error


@pytest.mark.multirank
def test_a_wrong_but_finite_op_is_failed_by_the_small_check(tmp_path: Path):
    done, results = _run_with("scaled", tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    for result in results.values():
        assert result.status == "failed" and not result.rounds
        assert result.error.startswith("outputs differ from the reference: rel-L2 ")
        assert "against the fp64 single-device layer" in result.error


@pytest.mark.multirank
def test_cp_that_breaks_only_at_the_real_size_is_failed_against_its_cp1_twin(tmp_path: Path):
    done, results = _run_with("cp_only", tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    single, broken = results["p2p-ckpt-cp1-T64-fwd_bwd"], results["p2p-ckpt-cp2-T64-fwd_bwd"]
    assert single.status == "ok" and single.check is not None and single.check.small is not None
    assert broken.status == "failed" and broken.estimate is None
    assert broken.error.startswith("outputs differ from the same case at cp 1 (p2p-ckpt-cp1-T64-fwd_bwd)")


@pytest.mark.multirank
def test_transformers_with_fla_behind_it_is_failed_naming_both(tmp_path: Path):
    done, results = _run_with("swapped", tmp_path, "backend: [transformers]\n")
    assert done.returncode == 2, done.stdout + done.stderr
    for result in results.values():
        assert result.status == "failed"
        assert result.error.startswith(
            "asked backend transformers, ran fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule: "
            "transformers switches to FLA's kernel when fla imports"
        )


@pytest.mark.multirank
def test_an_unbroken_run_records_what_ran_and_its_checks(tmp_path: Path):
    done, results = _run_with("", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    single, cp2 = results["p2p-ckpt-cp1-T64-fwd_bwd"], results["p2p-ckpt-cp2-T64-fwd_bwd"]
    for result in (single, cp2):
        assert result.status == "ok"
        (call,) = result.ran
        assert (call.mode, call.layout, call.local_path, call.checkpoint_summary) == (
            "p2p",
            "contiguous",
            "kcp",
            True,
        )
        assert [op.op for op in call.ops] == ["gdn_cp.ops.chunk.pieces.summarise_chunks"]
        assert result.check.small.worst()[1] < GATE_REL_L2["fp32"]
        assert all(r.first_use_s is not None and r.first_use_s > 0 for r in result.rounds)
    assert cp2.check.reference == "p2p-ckpt-cp1-T64-fwd_bwd"
    assert cp2.check.reference_rel_l2 < 1e-5  # fp32 CP against one device


@pytest.mark.multirank
def test_a_backends_first_use_is_timed_apart_and_never_in_the_figures(tmp_path: Path):
    """Issue 45: with warmup 1 the memory pass was the first pass, so a kernel's autotuning buffers counted
    in the peak, and its compile time could reach the timed passes. The op here allocates 64 MiB and sleeps
    0.5 s on its first call in a process: that shows in the first pass's time alone."""
    done, results = _run_with("first_use", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for result in results.values():
        assert result.status == "ok"
        assert all(r.first_use_s >= 0.5 for r in result.rounds)
        assert max(s for r in result.rounds for rank in r.samples_s for s in rank) < 0.5
        assert result.memory.peak_bytes < 32 * 2**20  # the tiny case's own, without the 64 MiB
