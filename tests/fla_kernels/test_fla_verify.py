"""`bench verify`'s power on backend fla (issue 48), interpreted: the layer check of a p2p case at cp 2 on
FLA's kernels passes, and catches each of CP's mutants and each mutant of FLA's op
(gdn_cp.ops.backends.mutants, on every rank: the op standing in for the backend through the seam), as bench
verify runs them."""

from __future__ import annotations

import pytest

from bench.suite.config import Case, Scenario, Sweep
from bench.verification.mutants import case_mutants
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.ops.backends import mutants as backend_mutants
from tests.bench.verification.layer_check import layer_check_on_two_ranks

LAYER = GatedDeltaNetConfig(
    hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, chunk_size=16
)
"""The tiny layer at sizes FLA's kernels take (head dims 16, chunks of 16)."""
SEQ_LEN = 32


def _case() -> Case:
    sweep = Sweep(
        cp=[2],
        seq_len=[SEQ_LEN],
        mode=["p2p"],
        backend=["fla"],
        checkpoint=[True],
        pass_=["forward_backward"],
    )
    (case,) = Scenario(name="s", layer=LAYER, sweep=sweep).cases(warmup=0, repeat=1)
    return case


@pytest.mark.multirank
def test_the_layer_check_on_fla_catches_every_mutant():
    case = _case()
    record = layer_check_on_two_ranks(case, timeout_s=600)
    assert record.passed, record.failures()
    verdicts = {v.mutant: v for v in record.power}
    assert list(verdicts) == case_mutants(case, 2, documents=True)
    assert {m.name for m in backend_mutants.MUTANTS} <= set(verdicts)
    assert not [name for name, v in verdicts.items() if not v.caught], record.power
