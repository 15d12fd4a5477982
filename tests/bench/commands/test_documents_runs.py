"""Real 2-rank launches of a tiny scenario in the zigzag layout with packed documents: the ranks get zigzag
shards of one input, `bench run` measures and shows packed against unpacked, and `bench verify` passes every
mode against the per-document reference, and fails a layer that ignores the documents or the layout."""

from __future__ import annotations

from pathlib import Path

import bench_ranks
import pytest
import torch
import verify_ranks
from tiny import TINY_LAYER_YAML, tiny_scenario

from bench.commands import run as run_command
from bench.commands import show as show_command
from bench.commands import verify as verify_command
from bench.launch.local import run_on_ranks
from bench.measure.inputs import INPUT, global_tensor
from bench.measure.rank import cu_seqlens_of
from bench.results.store import load_result
from bench.suite.config import Sweep

pytestmark = pytest.mark.multirank

PACKED = (
    "description: tiny layer, zigzag shards of packed documents\n"
    + TINY_LAYER_YAML
    + """\
warmup: 1
repeat: 2
cp: [2]
seq_len: [64]
mode: [ulysses, p2p, all_gather]
checkpoint: [true]
pass: [forward_backward]
layout: [zigzag]
documents: {count: 5, lengths: lognormal, seed: 0}
thresholds:
  fp32: {rel_l2: 1.0e-4, param_rel_l2: 1.0e-4, grad_norm_rel: 1.0e-4}
"""
)
"""Every mode at cp 2; 5 documents of 4-24 tokens cross both pieces of each rank and the piece edges."""


@pytest.fixture
def packed_scenario(write_scenario) -> Path:
    return write_scenario("packed", PACKED)


def test_ranks_get_zigzag_shards_of_one_input_and_the_global_boundaries():
    (case,) = tiny_scenario(
        seed=7,
        sweep=Sweep(
            cp=[2], seq_len=[16], mode=["p2p"], pass_=["forward"], layout=["zigzag"], documents={"count": 3}
        ),
    ).cases(warmup=0, repeat=1)
    ranks = run_on_ranks(bench_ranks.built_tensors, 2, (case, "cpu"))
    x = global_tensor((1, 16, case.layer.hidden_size), torch.float32, seed=case.seed, stream=INPUT)
    x = x.chunk(4, dim=1)
    assert torch.equal(ranks[0]["x"], torch.cat([x[0], x[3]], dim=1))  # pieces r and 2 cp - 1 - r
    assert torch.equal(ranks[1]["x"], torch.cat([x[1], x[2]], dim=1))
    cu = cu_seqlens_of(case)
    assert cu is not None and cu.dtype == torch.int64 and cu.tolist() == [0, 6, 11, 16]


def test_run_measures_zigzag_packed_cases_and_shows_the_packing_cost(
    suite_dir: Path, packed_scenario: Path, capsys
):
    out = suite_dir / "packed.json"
    sets = ["documents=[null, {count: 5, lengths: lognormal}]"]
    assert run_command.run(["packed"], filters=["mode=p2p"], sets=sets, output=str(out)) == 0
    run = load_result(out)
    assert sorted(c.case.case_id for c in run.cases) == [  # in the order they finished: shuffled rounds
        "p2p-ckpt-cp2-T64-zigzag-docs5-lognormal-fwd_bwd",
        "p2p-ckpt-cp2-T64-zigzag-fwd_bwd",
    ]
    assert all(c.status == "ok" and c.timing.median_s > 0 for c in run.cases)
    capsys.readouterr()
    assert show_command.run(str(out)) == 0
    printed = capsys.readouterr().out
    assert "packed documents vs the same tokens unpacked" in printed and "docs5-lognormal" in printed


def test_verify_passes_every_mode_against_the_per_document_reference(
    suite_dir: Path, packed_scenario: Path, capsys
):
    out = suite_dir / "verify.json"
    assert verify_command.run(["packed"], output=str(out)) == 0
    records = load_result(out).verifications
    assert [r.case.mode for r in records] == ["ulysses", "p2p", "all_gather"]
    for r in records:
        assert r.passed, r.failures()
        assert r.comparisons[0].output.rel_l2 < 1e-5 and r.comparisons[0].input_grad.rel_l2 < 1e-5
    assert "zigzag layout, docs5-lognormal" in capsys.readouterr().out  # the table's title


@pytest.mark.parametrize("hook", [verify_ranks.ignore_documents, verify_ranks.ignore_layout])
def test_verify_fails_a_layer_that_ignores_the_documents_or_the_layout(
    suite_dir: Path, packed_scenario: Path, hook
):
    out = suite_dir / "broken.json"
    code = verify_command.run(["packed"], filters=["mode=p2p"], output=str(out), layer_hook=hook)
    assert code == verify_command.EXIT_CHECK_FAILED
    (record,) = load_result(out).verifications
    assert record.status == "ok" and not record.passed
    assert record.comparisons[0].output.rel_l2 > 1e-3
