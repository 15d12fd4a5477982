"""State summaries: packing, folding, gradcheck through prepare_chunks, and the checkpointed summary (same
values and gradients as the plain one, fewer saved tensors)."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    GDNInputs,
    Shape,
    assert_close_scaled,
    gdn_inputs,
    random_state,
    saved_tensor_bytes,
    weighted_sum,
)

from gdn_cp.ops import (
    apply_summary,
    fold_summaries,
    gdn_state_summary,
    pack_summary,
    prepare_chunks,
    unpack_summary,
)
from gdn_cp.ops.summary import Summary

SHAPE = Shape(2, 45, 2, 4, 8, 5)


def _random_summary(shape: Shape, seed: int) -> Summary:
    gen = torch.Generator().manual_seed(seed)
    B, Hv, K, V = shape.state
    S = torch.randn(B, Hv, K, V, generator=gen, dtype=torch.float64)
    M = torch.randn(B, Hv, K, K, generator=gen, dtype=torch.float64)
    return S, M


def _summary(x: GDNInputs, checkpoint_summary: bool, chunk_size: int = 8) -> Summary:
    chunks = prepare_chunks(*x, use_qk_l2norm_in_kernel=True, chunk_size=chunk_size)
    return gdn_state_summary(chunks, checkpoint_summary=checkpoint_summary)


def test_pack_unpack_round_trip() -> None:
    S, M = _random_summary(SHAPE, seed=0)
    packed = pack_summary(S, M)
    assert packed.shape == (SHAPE.B, SHAPE.Hv, SHAPE.K, SHAPE.V + SHAPE.K)
    S2, M2 = unpack_summary(packed, SHAPE.V)
    assert torch.equal(S2, S) and torch.equal(M2, M)


def test_fold_summaries_applies_in_order() -> None:
    summaries = [_random_summary(SHAPE, seed) for seed in range(3)]
    H = random_state(SHAPE)
    expected = H
    for S, M in summaries:
        expected = M @ expected + S
    # Each fold step is a K-long dot product per entry, over len(summaries) steps.
    terms = len(summaries) * SHAPE.K
    assert_close_scaled(fold_summaries(summaries, H), expected, torch.float64, terms=terms)
    # From zeros, the first summary's M never matters.
    expected = summaries[0][0]
    for S, M in summaries[1:]:
        expected = M @ expected + S
    assert_close_scaled(fold_summaries(summaries), expected, torch.float64, terms=terms)


def test_fold_summaries_empty() -> None:
    H = random_state(SHAPE)
    assert torch.equal(fold_summaries([], H), H)
    with pytest.raises(ValueError, match="initial_state"):
        fold_summaries([])


def test_empty_segment_is_identity() -> None:
    S, M = _summary(gdn_inputs(Shape(1, 0, 1, 2, 4, 3)), checkpoint_summary=False)
    assert torch.equal(S, torch.zeros(1, 2, 4, 3, dtype=torch.float64))
    assert torch.equal(M, torch.eye(4, dtype=torch.float64).expand(1, 2, 4, 4))


@pytest.mark.parametrize("checkpoint_summary", [False, True], ids=["plain", "checkpoint"])
def test_gradcheck_summary_through_prepare_chunks(checkpoint_summary: bool) -> None:
    x = gdn_inputs(Shape(1, 10, 1, 2, 3, 2), requires_grad=True)

    def fn(*qkvgb: torch.Tensor) -> Summary:
        return _summary(GDNInputs(*qkvgb), checkpoint_summary, chunk_size=4)

    assert torch.autograd.gradcheck(fn, tuple(x))


def test_checkpointed_summary_equals_plain_values_and_gradients() -> None:
    x = gdn_inputs(SHAPE, requires_grad=True)
    S, M = _summary(x, checkpoint_summary=False)
    S_ckpt, M_ckpt = _summary(x, checkpoint_summary=True)
    terms = SHAPE.T * SHAPE.K  # T tokens, each a K-long dot product
    assert_close_scaled(S_ckpt, S, torch.float64, terms=terms)
    assert_close_scaled(M_ckpt, M, torch.float64, terms=terms)
    H = random_state(SHAPE)
    # Through apply_summary too, as a CP rank uses it: dM = dH_out H_in^T must flow back into the inputs.
    loss = weighted_sum(S, M, apply_summary((S, M), H))
    loss_ckpt = weighted_sum(S_ckpt, M_ckpt, apply_summary((S_ckpt, M_ckpt), H))
    # A summary does not read q (only outputs do): its gradient must be absent in both.
    plain = torch.autograd.grad(loss, tuple(x), allow_unused=True)
    ckpt = torch.autograd.grad(loss_ckpt, tuple(x), allow_unused=True)
    assert plain[0] is None and ckpt[0] is None
    for name, a, b in zip(("k", "v", "g", "beta"), ckpt[1:], plain[1:], strict=True):
        assert a is not None and b is not None
        # Gradients also sum over the V columns of the state.
        assert_close_scaled(a, b, torch.float64, terms=terms * SHAPE.V, msg=f"d{name}:")


def test_checkpointed_summary_saves_less() -> None:
    """Checkpointing keeps no per-chunk graph: the summary's forward saves strictly fewer bytes."""
    x = gdn_inputs(Shape(1, 256, 2, 4, 16, 8), dtype=torch.float32, requires_grad=True)
    chunks = prepare_chunks(*x, use_qk_l2norm_in_kernel=True, chunk_size=16)
    saved = {}
    for checkpoint_summary in (False, True):
        with saved_tensor_bytes() as total:
            gdn_state_summary(chunks, checkpoint_summary=checkpoint_summary)
        saved[checkpoint_summary] = total[0]
    assert saved[False] > 0
    assert saved[True] < saved[False]
