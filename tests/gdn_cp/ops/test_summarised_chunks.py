"""summarise_chunks (gdn_cp.ops.chunk.deferred, FLA's KCP in the chunk stages): two pieces of one sequence in
one process, the second entering with the first's state through its summary (H = M h + S, differentiable, as
every CP exchange folds), equal the recurrent reference on the whole sequence per document, in value and in
every gradient (fp64): outputs, final states, dq, dk, dv, dg, dbeta, the first piece's entering state and the
documents' initial states. Both ways of keeping (recompute on and off), documents inside and across the
pieces, resets inside a summarised piece, several forward and backward blocks of chunks.
"""

from __future__ import annotations

import pytest
import torch
from helpers import PAIR_NAMES, Shape, assert_close_scaled, two_pieces_against_reference

from gdn_cp.ops import summarise_chunks
from gdn_cp.ops.chunk import FORWARD_BLOCK

SHAPE = Shape(B=2, T=84, Hk=2, Hv=4, K=6, V=5)
CHUNK = 2  # a piece of 42 tokens holds 21 chunks: more than one forward block (16) and many backward ones
PIECE = 42
assert PIECE // CHUNK > FORWARD_BLOCK
KW = {"use_qk_l2norm_in_kernel": True, "chunk_size": CHUNK}

DOCUMENTS = {
    # global document starts (besides 0): one document across both pieces; documents inside both pieces (the
    # first piece's summary then has M = 0 and S from a fresh state); a boundary at the pieces' edge
    "across": [],
    "inside": [5, PIECE + 3, PIECE + 4],
    "at-the-edge": [PIECE],
}


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "kept"])
@pytest.mark.parametrize("documents", list(DOCUMENTS))
def test_two_pieces_through_summaries_match_the_reference(documents: str, recompute: bool) -> None:
    starts = DOCUMENTS[documents]
    pieces = [(0, PIECE), (PIECE, SHAPE.T)]
    kw = {"recompute": recompute, **KW}
    expected, got = two_pieces_against_reference(summarise_chunks, SHAPE, starts, torch.float64, pieces, **kw)
    for name, actual, want in zip(PAIR_NAMES, got, expected, strict=True):
        if want is None:  # one document: the fresh states are not read
            assert actual is None or not actual.any(), name
            continue
        assert_close_scaled(actual, want, torch.float64, terms=SHAPE.T, msg=f"{documents} {name}")
