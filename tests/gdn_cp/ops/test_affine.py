"""The backend seam (gdn_cp.ops.affine): a shard's segments as affine functions of their entering states,
through one op of FLA's signature at value width V + K (affine_rule), or their maps from a summary hook or the
seam without a graph and their outputs at width V (segment_summaries, segments_rule), equal the op run on
every segment from its true state, in value and in every gradient (fp64): outputs, final states, the maps
[S | M], and the gradients of q, k, v, g, beta, of the entering state and of the fresh states."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from helpers import Shape, assert_close_scaled, gdn_inputs, weighted_sum

from gdn_cp.ops import (
    affine_rule,
    chunk_gated_delta_rule,
    get_backend,
    recurrent_gated_delta_rule,
    register_backend,
    segment_summaries,
    segments_rule,
    unregister_backend,
)

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
        # The maps of the first segment (from [0 | I]) from the hook ("hook") or the seam's fallback ("seam"),
        # used as the exchange uses them: its final state is S + M H for the state H entering it.
        backend = get_backend("gdn_cp" if how == "hook" else "seam_only")
        summaries = segment_summaries(backend, *x, bounds=bounds, segments=[0], **KW)
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
        summaries.set_entering(start)
        S, M = summaries.maps[:, 0, ..., : SHAPE.V], summaries.maps[:, 0, ..., SHAPE.V :]
        finals = torch.cat([S.unsqueeze(1) + (M @ start[:, 0]).unsqueeze(1), finals[:, 1:]], dim=1)
    weighted_sum(o, finals).backward()
    grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in (*x, entering, fresh)]
    return [o.detach(), finals.detach(), *grads]


@pytest.fixture(autouse=True, scope="module")
def seam_only():
    """gdn_cp's op registered without a summary hook: Backend.summarise falls back to the seam."""
    register_backend(
        "seam_only",
        chunk_gated_delta_rule,
        dtypes=(torch.float64,),
        takes_chunk_size=True,
        grouped_values=True,
        varlen=True,
    )
    yield
    unregister_backend("seam_only")


@pytest.mark.parametrize("segments", SEGMENTS)
@pytest.mark.parametrize("how", ["affine", "hook", "seam"])
def test_the_seam_equals_each_segment_from_its_true_state(how: str, segments: str) -> None:
    names = ["o", "final", "dq", "dk", "dv", "dg", "dbeta", "d_entering", "d_fresh"]
    got, want = _run(how, segments), _run("reference", segments)
    for name, a, b in zip(names, got, want, strict=True):
        assert_close_scaled(a, b, torch.float64, terms=SHAPE.T * SHAPE.K, check_dtype=False, msg=name)


@pytest.mark.parametrize("documents", [None, [0, 5, 6, 41]], ids=["batch", "documents"])
def test_the_summary_hook_equals_the_seam_and_the_reference(documents) -> None:
    """gdn_cp's hook (its chunk chain of the state, no outputs) and the seam's fallback (the op at V + K from
    [0 | I]) give each sequence's map of its entering state: S + M H is the final state from H."""
    x = gdn_inputs(SHAPE, seed=7)
    if documents is not None:
        x = [t[:1] for t in x]
    n = SHAPE.B if documents is None else len(documents) - 1
    hook = get_backend("gdn_cp").summarise(*x, cu_seqlens=documents, **KW)
    seam = get_backend("seam_only").summarise(*x, cu_seqlens=documents, **KW)
    h = _states(n, 8)[0] if documents is not None else _states(1, 8)[:, 0]
    _, final = recurrent_gated_delta_rule(
        *x,
        initial_state=h,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=None if documents is None else torch.tensor(documents),
    )
    assert hook.shape == seam.shape == (n, SHAPE.Hv, SHAPE.K, SHAPE.V + SHAPE.K)
    assert_close_scaled(hook, seam, torch.float64, terms=SHAPE.T * SHAPE.K)
    S, M = hook[..., : SHAPE.V], hook[..., SHAPE.V :]
    assert_close_scaled(S + M @ h, final, torch.float64, terms=SHAPE.T * SHAPE.K)


def test_bad_segments_are_refused() -> None:
    x = gdn_inputs(SHAPE, seed=1)
    with pytest.raises(ValueError, match="must rise strictly from 0 to L = 41"):
        affine_rule(get_backend("gdn_cp"), *x, bounds=[0, 20, 40], carried=[True, False], **KW)
    with pytest.raises(ValueError, match="2 carried flags for 1 segments"):
        affine_rule(get_backend("gdn_cp"), *x, bounds=[0, 41], carried=[True, False], **KW)


def test_summarise_adapts_a_hook_as_rule_adapts_the_op() -> None:
    """A hook registered with an op that takes neither cu_seqlens nor grouped value heads is called once per
    document with its key heads repeated, as the op is; the maps equal gdn_cp's."""
    seen = []

    def hook(q, k, v, g, beta, scale=None, use_qk_l2norm_in_kernel=False, **kw):
        assert "cu_seqlens" not in kw and q.shape[2] == v.shape[2], "passed what it does not take"
        seen.append(q.shape[1])
        return get_backend("gdn_cp").summary_op()(
            q, k, v, g, beta, scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, chunk_size=CHUNK
        )

    register_backend("hook_min", recurrent_gated_delta_rule, dtypes=(torch.float64,), summary=hook)
    seen.clear()  # the registration's check called it
    try:
        x = [t[:1] for t in gdn_inputs(SHAPE, seed=9)]
        documents = [0, 5, 6, 41]
        got = get_backend("hook_min").summarise(*x, cu_seqlens=documents, use_qk_l2norm_in_kernel=True)
        want = get_backend("gdn_cp").summarise(*x, cu_seqlens=documents, **KW)
    finally:
        unregister_backend("hook_min")
    assert seen == [5, 1, 35]
    assert_close_scaled(got, want, torch.float64, terms=SHAPE.T * SHAPE.K)
