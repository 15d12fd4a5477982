"""Single-device Gated DeltaNet math: no torch.distributed in this package.

Shape legend (the FLA / transformers layout, used by every op here):

    B    batch
    T    sequence length (tokens)
    Hk   query/key heads
    Hv   value heads, a multiple of Hk: key head i serves value heads [i*G, (i+1)*G), G = Hv // Hk
    K    query/key head dim
    V    value head dim
    C    chunk size; N = ceil(T / C) chunks

    q, k           [B, T, Hk, K]
    v              [B, T, Hv, V]
    g, beta        [B, T, Hv]        (g: log-decay <= 0; beta in (0, 1))
    state H        [B, Hv, K, V]
    summary S, M   [B, Hv, K, V], [B, Hv, K, K]   H_out = M @ H_in + S
    packed [S | M] [B, Hv, K, V + K]
    cu_seqlens     [n + 1] document boundaries of a packed batch (B = 1), as in FLA; states then [n, Hv, K, V]

Every op takes (q, k, v, g, beta) in that order; the local op's whole signature (FLA's) is declared once, in
gdn_cp.ops.backends.RuleOp. Inputs in bf16/fp16 are accumulated in fp32 and outputs come back in the input
dtype; fp64 stays fp64.
"""

from gdn_cp.ops.affine import (
    AffineOutputs,
    SegmentSummaries,
    affine_rule,
    outputs_in_order,
    segment_outputs,
    segment_summaries,
    segments_rule,
)
from gdn_cp.ops.backends import (
    DEFAULT_BACKEND,
    Backend,
    RuleOp,
    backend_names,
    backend_sources,
    get_backend,
    import_backend_module,
    load_backend_plugins,
    register_backend,
    unregister_backend,
)
from gdn_cp.ops.chunk import (
    ChunkIntermediates,
    SplitOutputs,
    SummarisedChunks,
    chunk_gated_delta_rule,
    chunk_outputs,
    chunk_state_maps,
    prepare_chunks,
    split_chunk_outputs,
    summarise_chunks,
)
from gdn_cp.ops.conv import causal_conv1d, conv_state
from gdn_cp.ops.documents import check_packed_batch, document_bounds, document_positions
from gdn_cp.ops.flops import chunk_gdn_flops
from gdn_cp.ops.gates import gdn_gates
from gdn_cp.ops.norm import gated_rms_norm, l2norm
from gdn_cp.ops.recurrent import recurrent_gated_delta_rule
from gdn_cp.ops.summary import (
    apply_summary,
    compose_summaries,
    fold_summaries,
    gdn_state_summary,
    pack_summary,
    unpack_summary,
)

__all__ = [
    "DEFAULT_BACKEND",
    "AffineOutputs",
    "Backend",
    "ChunkIntermediates",
    "RuleOp",
    "SegmentSummaries",
    "SplitOutputs",
    "SummarisedChunks",
    "affine_rule",
    "apply_summary",
    "backend_names",
    "backend_sources",
    "causal_conv1d",
    "check_packed_batch",
    "chunk_gated_delta_rule",
    "chunk_gdn_flops",
    "chunk_outputs",
    "chunk_state_maps",
    "compose_summaries",
    "conv_state",
    "document_bounds",
    "document_positions",
    "fold_summaries",
    "gated_rms_norm",
    "gdn_gates",
    "gdn_state_summary",
    "get_backend",
    "import_backend_module",
    "l2norm",
    "load_backend_plugins",
    "outputs_in_order",
    "pack_summary",
    "prepare_chunks",
    "recurrent_gated_delta_rule",
    "register_backend",
    "segment_outputs",
    "segment_summaries",
    "segments_rule",
    "split_chunk_outputs",
    "summarise_chunks",
    "unpack_summary",
    "unregister_backend",
]
