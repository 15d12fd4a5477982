"""`bench verify`'s layer check of one case on 2 gloo ranks, as a record (what the power tests of a backend's
op read: tests/bench/verification and tests/fla_kernels)."""

from __future__ import annotations

import dataclasses
import functools

import torch

from bench.launch.local import run_on_ranks
from bench.results.verifications import LayerVerification
from bench.suite.config import Case
from bench.verification import compare_on_rank
from gdn_cp.accuracy import Thresholds
from tests.gdn_cp.ops.helpers import tolerance


def layer_check_on_two_ranks(case: Case, *, timeout_s: float) -> LayerVerification:
    """The case's layer check on seed 0 with its mutants, judged at fp32 bars from fp32's roundoff over one
    output's terms (the case's tokens x hidden size)."""
    runs = run_on_ranks(functools.partial(compare_on_rank, seeds=[0]), 2, (case, "cpu"), timeout_s=timeout_s)[
        0
    ]
    bar = tolerance(torch.float32, terms=case.seq_len * case.layer.hidden_size)
    fields = {f.name: getattr(runs, f.name) for f in dataclasses.fields(runs)}
    bars = dataclasses.asdict(Thresholds.tight(bar))
    return LayerVerification(case=case, status="ok", seeds=[0], thresholds=bars, **fields)
