"""The backend seam (gdn_cp.ops.affine): a shard's segments as affine functions of their entering states,
through one op of FLA's signature at value width V + K, equal the op run on every segment from its true
state, in value and in every gradient (fp64): outputs, final states, the maps [S | M], and the gradients of
q, k, v, g, beta, of the entering state and of the fresh states."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from helpers import Shape, assert_close_scaled, gdn_inputs, weighted_sum

from gdn_cp.ops import affine_rule, get_backend, recurrent_gated_delta_rule, segment_maps, segments_rule

SHAPE = Shape(B=2, T=41, Hk=2, Hv=4, K=6, V=5)
CHUNK = 8
SEGMENTS = {
    # bounds, carried: a shard continuing a document, then documents starting inside it (a one-token one)
    "one": ([0, 41], [True]),
    "documents": ([0, 12, 13, 41], [True, False, False]),
    "starts-a-document": ([0, 20, 41], [False, False]),
}
KW = {"use_qk_l2norm_in_kernel": True, "chunk_size": CHUNK}


def _states(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 0.5 * torch.randn(SHAPE.B, n, SHAPE.Hv, SHAPE.K, SHAPE.V, generator=gen, dtype=torch.float64)


def _reference(x, bounds, carried, entering, fresh):
    """Each segment alone, from its true state, on the recurrent reference."""
    outs, finals = [], []
    for j, (lo, hi) in enumerate(pairwise(bounds)):
        start = entering[:, 0] if carried[j] else fresh[:, j]
        o, final = recurrent_gated_delta_rule(
            *(t[:, lo:hi] for t in x),
            initial_state=start,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        outs.append(o)
        finals.append(final)
    return torch.cat(outs, dim=1), torch.stack(finals, dim=1)


def _run(how: str, segments: str) -> list[torch.Tensor]:
    bounds, carried = SEGMENTS[segments]
    x = [t.requires_grad_(True) for t in gdn_inputs(SHAPE, seed=4)]
    entering = _states(1, 5).requires_grad_(True)  # the state entering the first segment
    fresh = _states(len(carried), 6).requires_grad_(True)
    backend = get_backend("gdn_cp")
    shard = {"bounds": bounds, "carried": carried, "fresh_states": fresh, **KW}
    if how == "reference":
        o, finals = _reference(x, bounds, carried, entering, fresh)
    elif how == "affine":
        # The first segment reads H_in even where it starts a document: exact zeros, H_in in the graph.
        affine = affine_rule(backend, *x, reading=[0], finals=True, **shard)
        o, finals = affine.with_entering_states(entering, output_final_state=True)
    else:
        maps = segment_maps(backend, *x, segments=[0], recompute=how == "recompute", **shard)
        start = entering if carried[0] else fresh[:, :1]
        o, finals = segments_rule(
            backend,
            *x,
            bounds=bounds,
            reading=[0],
            entering=start,
            fresh_states=fresh,
            output_final_state=True,
            **KW,
        )
        # The first segment's final state from its map: the maps' gradients reach the inputs through it.
        S, M = maps[:, 0, ..., : SHAPE.V], maps[:, 0, ..., SHAPE.V :]
        finals = torch.cat([S.unsqueeze(1) + (M @ entering[:, 0]).unsqueeze(1), finals[:, 1:]], dim=1)
    weighted_sum(o, finals).backward()
    grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in (*x, entering, fresh)]
    return [o.detach(), finals.detach(), *grads]


@pytest.mark.parametrize("segments", SEGMENTS)
@pytest.mark.parametrize("how", ["affine", "maps", "recompute"])
def test_the_seam_equals_each_segment_from_its_true_state(how: str, segments: str) -> None:
    names = ["o", "final", "dq", "dk", "dv", "dg", "dbeta", "d_entering", "d_fresh"]
    got, want = _run(how, segments), _run("reference", segments)
    for name, a, b in zip(names, got, want, strict=True):
        assert_close_scaled(a, b, torch.float64, terms=SHAPE.T * SHAPE.K, check_dtype=False, msg=name)


def test_a_segment_that_starts_a_document_has_a_zero_map_and_its_state_as_s() -> None:
    x = gdn_inputs(SHAPE, seed=7)
    fresh = _states(2, 8)
    maps = segment_maps(
        get_backend("gdn_cp"),
        *x,
        bounds=[0, 20, 41],
        carried=[True, False],
        segments=[1],
        fresh_states=fresh,
        **KW,
    )
    _, final = recurrent_gated_delta_rule(
        *(t[:, 20:] for t in x),
        initial_state=fresh[:, 1],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    assert torch.equal(maps[:, 0, ..., SHAPE.V :], torch.zeros_like(maps[:, 0, ..., SHAPE.V :]))
    assert_close_scaled(maps[:, 0, ..., : SHAPE.V], final, torch.float64, terms=SHAPE.T * SHAPE.K)


def test_bad_segments_are_refused() -> None:
    x = gdn_inputs(SHAPE, seed=1)
    with pytest.raises(ValueError, match="must rise strictly from 0 to L = 41"):
        affine_rule(get_backend("gdn_cp"), *x, bounds=[0, 20, 40], carried=[True, False], **KW)
    with pytest.raises(ValueError, match="2 carried flags for 1 segments"):
        affine_rule(get_backend("gdn_cp"), *x, bounds=[0, 41], carried=[True, False], **KW)
