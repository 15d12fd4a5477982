"""Chunked (WY / UT-transform) Gated DeltaNet: the fast path, with a hand-written backward.

Math (design.md section 2), per chunk of C tokens with in-chunk cumulative log-decay gamma:
    Gamma_ij = exp(gamma_i - gamma_j) for i >= j, else 0
    L = strict_lower(diag(beta) K K^T * Gamma),  A = (I + L)^-1          (the UT transform, explicit)
    W = A (beta e^gamma K),  U = A (beta V),  Kt = e^(gamma_C - gamma) K,  Qg = e^gamma Q,  P = Q K^T * Gamma
    v_new = U - W H,  o = Qg H + P v_new,  H' = e^gamma_C H + Kt^T v_new

One stage a module, as FLA splits its kernels (wy_fast, chunk_delta_h, chunk_o), each a plain forward and
backward function with an autograd.Function over them, called with keywords and handing each other named
tuples (`intermediates`: ChunkInputs, Prepared; their gradients under the same names):
- `layout`: inputs -> chunks ([B, Hk, G, N, C, ...], value heads grouped under their key head), states per
  segment, outputs back to [B, T, Hv, V];
- `prepare` (stage 1): chunked inputs -> the state-independent intermediates (Qg, Kt, W, U, P, decay) and A;
- `scan` (stage 2): intermediates and an entering state -> outputs and the leaving state;
- `rule`: both in one Function, block by block (`chunk_gated_delta_rule`, the fused op);
- `pieces`: the stages apart for context parallelism (`prepare_chunks`, `chunk_outputs`,
  `split_chunk_outputs`, `summarise_chunks`);
- `deferred`: summaries without outputs, then the outputs with one backward at width V (FLA's KCP).

Segments (packed documents, cu_seqlens; gdn_cp.ops.documents): every segment is cut into chunks of its own,
so the chunk math above is unchanged; without cu_seqlens the whole sequence is one segment. Every Python loop
is over chunks with constant work per step, and the backward writes each gradient once: O(T) in forward and
backward.
"""

from gdn_cp.ops.chunk.intermediates import ChunkIntermediates
from gdn_cp.ops.chunk.pieces import (
    SplitOutputs,
    SummarisedChunks,
    chunk_outputs,
    chunk_state_maps,
    prepare_chunks,
    split_chunk_outputs,
    summarise_chunks,
)
from gdn_cp.ops.chunk.rule import BACKWARD_BLOCK, FORWARD_BLOCK, chunk_gated_delta_rule

__all__ = [
    "BACKWARD_BLOCK",
    "FORWARD_BLOCK",
    "ChunkIntermediates",
    "SplitOutputs",
    "SummarisedChunks",
    "chunk_gated_delta_rule",
    "chunk_outputs",
    "chunk_state_maps",
    "prepare_chunks",
    "split_chunk_outputs",
    "summarise_chunks",
]
