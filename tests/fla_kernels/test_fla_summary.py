"""Backend fla's summary hook and summaries-then-outputs pair (gdn_cp.ops.backends.fla_summary, fla_kcp: FLA's
KCP through its own kernels), interpreted on the CPU (conftest), fp32 against the fp64 recurrent reference.

- the hook: each sequence's [S | M], S + M H equal to the final state from H (batch rows, and documents);
- the pair: two pieces of one sequence, the second entering with M h + S of the first, as the CP exchanges
  fold: outputs, final states and every gradient (q, k, v, g, beta, the entering state, the documents'
  initial states), FLA's memory (recompute) and w, u and the states kept; documents inside and across pieces.

Bar: 1e-5 of the reference's scale (test_fla.py says why); seen: <= 5e-7.
"""

from __future__ import annotations

import pytest
import torch

from gdn_cp.ops import get_backend, recurrent_gated_delta_rule
from tests.gdn_cp.ops.helpers import PAIR_NAMES, Shape, gdn_inputs, two_pieces_against_reference

FP32 = 1e-5
SHAPE = Shape(B=2, T=64, Hk=1, Hv=2, K=16, V=16)
CHUNK = 16


def _rel(actual: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.detach().abs().max().item()
    return (actual.detach().double() - reference.detach().double()).abs().max().item() / scale


@pytest.mark.parametrize("documents", [None, [0, 5, 21, 64]], ids=["batch", "documents"])
def test_the_fla_hook_maps_each_sequence(documents) -> None:
    x = gdn_inputs(SHAPE, seed=1)
    if documents is not None:
        x = [t[:1] for t in x]
    n = SHAPE.B if documents is None else len(documents) - 1
    cu = None if documents is None else torch.tensor(documents)
    maps = get_backend("fla").summarise(
        *[t.float() for t in x], cu_seqlens=cu, use_qk_l2norm_in_kernel=True, chunk_size=CHUNK
    )
    h = 0.5 * torch.randn(
        n, SHAPE.Hv, SHAPE.K, SHAPE.V, generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )
    _, final = recurrent_gated_delta_rule(
        *x,
        initial_state=h,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu,
    )
    assert maps.shape == (n, SHAPE.Hv, SHAPE.K, SHAPE.V + SHAPE.K) and maps.dtype == torch.float32
    S, M = maps[..., : SHAPE.V].double(), maps[..., SHAPE.V :].double()
    assert _rel(S + M @ h, final) <= FP32


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "kept"])
@pytest.mark.parametrize("starts", [[], [5, 40]], ids=["across", "inside"])
def test_the_fla_pair_matches_the_reference_through_a_summary(starts, recompute) -> None:
    rule = get_backend("fla").kcp_rule()
    pieces = [(0, 32), (32, SHAPE.T)]
    kw = {"recompute": recompute, "use_qk_l2norm_in_kernel": True, "chunk_size": CHUNK}
    expected, got = two_pieces_against_reference(rule, SHAPE, starts, torch.float32, pieces, **kw)
    errors = {}
    for name, actual, want in zip(PAIR_NAMES, got, expected, strict=True):
        if want is None:  # one document: the fresh states are not read
            assert actual is None or not actual.any(), name
            continue
        errors[name] = _rel(actual, want)
    assert max(errors.values()) <= FP32, errors
