"""Backends of the local op: which kernel computes the chunked gated delta rule on one device (gdn_cp's own,
FLA's Triton kernels, transformers' torch fallback, or a user's op of FLA's signature).

    registry.py        Backend (what an op supports, and `rule`, which checks, adapts and calls it), the
                       registry (`get_backend`, `register_backend`) and the built-in entries
    fla.py             FLA's op, loaded on first use; interpreter.py lets it run under TRITON_INTERPRET=1
    fla_summary.py     FLA's summary hook ([S | M] from its intra pass and KCP kernel)
    fla_kcp.py         FLA's summaries-then-outputs pair (KCP through its forward and backward pieces)
    torch_fallback.py  transformers' torch_chunk_gated_delta_rule
"""

from gdn_cp.ops.backends.interpreter import InterpreterSupportError, support_interpreter
from gdn_cp.ops.backends.registry import (
    BUILT_IN,
    DEFAULT_BACKEND,
    Backend,
    KCPRule,
    RuleOp,
    SummaryOp,
    add_backend,
    backend_names,
    get_backend,
    register_backend,
    unregister_backend,
)

__all__ = [
    "BUILT_IN",
    "DEFAULT_BACKEND",
    "Backend",
    "InterpreterSupportError",
    "KCPRule",
    "RuleOp",
    "SummaryOp",
    "add_backend",
    "backend_names",
    "get_backend",
    "register_backend",
    "support_interpreter",
    "unregister_backend",
]
