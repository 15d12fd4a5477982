"""backend "fla": flash-linear-attention's Triton kernels (fla-core), interpreted on the CPU, against the fp64
recurrent reference and through every CP mode on 2 gloo ranks (conftest: where they run, and why else not).

Bars: 1e-5 of the reference's scale, fp32 (FLA accumulates in fp32 and refuses fp64): a few hundred fp32
roundoffs at these sizes (T <= 64 tokens of K = 16), orders of magnitude below any real error (a wrong
entering state, a dropped document boundary: O(1)).
"""

from __future__ import annotations

import fla_ranks
import pytest
import torch

from bench.launch.local import run_on_ranks
from gdn_cp.distributed import MODES
from gdn_cp.ops import get_backend, recurrent_gated_delta_rule
from tests.gdn_cp.ops.helpers import Shape, gdn_inputs, weighted_sum

FP32 = 1e-5
SHAPE = Shape(B=1, T=64, Hk=1, Hv=2, K=16, V=16)


def _rel(actual: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.detach().abs().max().item()
    return (actual.detach().double() - reference.detach().double()).abs().max().item() / scale


@pytest.mark.parametrize("documents", [None, [0, 20, 21, 64]], ids=["one-sequence", "documents"])
def test_fla_matches_the_reference_with_states_and_every_gradient(documents) -> None:
    x = gdn_inputs(SHAPE, seed=1)
    n = 1 if documents is None else len(documents) - 1
    h0 = 0.5 * torch.randn(n, SHAPE.Hv, SHAPE.K, SHAPE.V, generator=torch.Generator().manual_seed(2))
    results = []
    for name, dtype in (("fla", torch.float32), ("reference", torch.float64)):
        inputs = [t.detach().to(dtype).clone().requires_grad_(True) for t in x]
        state = h0.to(dtype).clone().requires_grad_(True)
        kw = {"initial_state": state, "output_final_state": True, "use_qk_l2norm_in_kernel": True}
        if name == "fla":
            o, final = get_backend("fla").rule(*inputs, cu_seqlens=documents, chunk_size=16, **kw)
        else:
            cu = None if documents is None else torch.tensor(documents)
            o, final = recurrent_gated_delta_rule(*inputs, cu_seqlens=cu, **kw)
        weighted_sum(o, final).backward()
        results.append([o, final, state.grad, *(t.grad for t in inputs)])
    names = ["o", "final", "d_initial_state", "dq", "dk", "dv", "dg", "dbeta"]
    errors = {name: _rel(a, b) for name, a, b in zip(names, *results, strict=True)}
    assert max(errors.values()) <= FP32, errors


def test_every_mode_runs_on_fla_across_two_ranks() -> None:
    """Outputs, final states and every gradient of cp_chunk_gated_delta_rule with backend fla: each mode,
    checkpoint on and off (FLA's KCP pair, its memory and w, u, states kept), documents across zigzag pieces
    with states, batch 2; and FLA's op behind the seam with its summary hook (the recompute and affine
    paths)."""
    cases = run_on_ranks(fla_ranks.run_world, 2, (2,), timeout_s=1500)[0]
    assert {mode for mode, _, _ in cases} == set(MODES)
    for key, errors in cases.items():
        bad = {n: e for n, e in errors.items() if n != "final_same_on_every_rank" and not e <= FP32}
        assert not bad, f"{key}: {bad}"
