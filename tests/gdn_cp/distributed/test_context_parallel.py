"""LinearAttentionContextParallel in every mode against the single-device layer with identical weights.

Each (mode, world size) test checks every case of that mode: fp64, fp32 and bf16, summary checkpoint on and
off, 6 tokens per rank and 1 token per rank: output, input gradient, every parameter gradient and the global
grad norm. fp64 and fp32 are held to bars derived from their roundoff, bf16 to the reference PR's scale-aware
bars.
"""

from __future__ import annotations

import cp_ranks
import pytest
import torch

from gdn_cp.accuracy import Thresholds
from gdn_cp.distributed import SUMMARY_MODES
from tests.gdn_cp.ops.helpers import tolerance

pytestmark = pytest.mark.multirank

DTYPES = {"fp64": torch.float64, "fp32": torch.float32}
BATCH = 2  # cp_ranks.layer_comparisons runs every case on a batch of 2


def _bars(case: cp_ranks.LayerCase, result: cp_ranks.LayerComparison) -> Thresholds:
    """bf16: the reference PR's bars (Thresholds(), project requirements); fp64, fp32: the dtype's roundoff.

    The sharded and the full computation sum in different orders: an output accumulates the core's T tokens,
    each fed by hidden_size-long projections; parameter gradients (the small A_log / dt_bias ones above all)
    also sum over the batch. The max-abs guards are the same bounds on the reference's own scale.
    """
    _, dtype, _, seq_len = case
    if dtype not in DTYPES:
        return Thresholds()
    terms = seq_len * cp_ranks.LAYER["hidden_size"]
    out = tolerance(DTYPES[dtype], terms=terms)
    param = tolerance(DTYPES[dtype], terms=BATCH * terms)
    return Thresholds(
        output_max_abs=out * result.output.ref_absmax,
        input_grad_max_abs=out * result.input_grad.ref_absmax,
        rel_max=out,
        rel_l2=out,
        param_rel_max=param,
        param_rel_l2=param,
        grad_norm_rel=param,
    )


MODE_WORLDS = [
    pytest.param(mode, world, id=f"{mode}-cp{world}")
    for world in (1, 2, 3, 4)
    for mode in cp_ranks.modes_for(world)
]


def _case_id(case: cp_ranks.LayerCase) -> str:
    mode, dtype, ckpt, seq = case
    return f"{mode}-{dtype}-{'ckpt' if ckpt else 'graph'}-T{seq}"


@pytest.mark.parametrize(("mode", "world"), MODE_WORLDS)
def test_mode_matches_the_reference(world_results, mode: str, world: int) -> None:
    results = world_results(world)[0]["layer"]
    cases = [c for c in results if c[0] == mode]
    assert len(cases) == (4 if mode == "ulysses" else 7)
    failures = {_case_id(c): results[c].failures(_bars(c, results[c])) for c in cases}
    assert not any(failures.values()), {k: v for k, v in failures.items() if v}
    for case in cases:
        assert not results[case].missing_grads and len(results[case].params) == 9, _case_id(case)


@pytest.mark.parametrize("world", [1, 2, 3, 4], ids=lambda w: f"cp{w}")
def test_overlap_matches_the_reference(world_results, world: int) -> None:
    """Overlap on (the outputs' state-free part computed while the summary exchange is in flight, forward and
    backward) in every summary mode: the same bars as without it."""
    results = world_results(world)[0]["overlap"]
    assert {c[0] for c in results} == set(SUMMARY_MODES)
    failures = {_case_id(c): results[c].failures(_bars(c, results[c])) for c in results}
    assert not any(failures.values()), {k: v for k, v in failures.items() if v}
    assert all(not r.missing_grads and len(r.params) == 9 for r in results.values())


def test_ulysses_is_exercised_where_heads_split() -> None:
    assert [w for w in (1, 2, 3, 4) if "ulysses" in cp_ranks.modes_for(w)] == [1, 2, 4]


@pytest.mark.parametrize("world", [2, 3, 4], ids=lambda w: f"cp{w}")
@pytest.mark.parametrize("mode", SUMMARY_MODES)
def test_checkpoint_summary_on_equals_off(world_results, mode: str, world: int) -> None:
    """On (the recompute path) and off (the split path) compute the same values in another order: fp64
    roundoff apart (eps sqrt(terms) ~ 1e-14 at these sizes)."""
    for rank in world_results(world):
        assert rank["checkpoint_on_off"][mode] <= 1e-12


@pytest.mark.parametrize("world", [2, 3, 4], ids=lambda w: f"cp{w}")
def test_steps_leave_no_tensor_behind(world_results, world: int) -> None:
    """Dropping the output (forward) or finishing backward frees the step's graph, in every mode and
    layout (cp_ranks.tensors_left_by_steps): a transfer that kept its own output held the graph forever
    (37 tensors a p2p forward step, 11 a training step, every step): some step leaves none."""
    for rank in world_results(world):
        left = rank["tensors_left"]
        assert left and all(n <= 0 for n in left.values()), {k: n for k, n in left.items() if n > 0}
