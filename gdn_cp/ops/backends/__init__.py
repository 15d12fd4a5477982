"""Backends of the local op: which kernel computes the chunked gated delta rule on one device (gdn_cp's own,
FLA's Triton kernels, transformers' torch fallback, or a user's op of RuleOp's signature, FLA's).

    entry.py           what a backend is: RuleOp (the op's signature, declared once), SummaryOp, KCPRule,
                       and Backend (what an op supports, and `rule`, the seam every CP mode calls: the call
                       checked, adapted, the op called); returned.py checks what the op returned
    native.py          the entries of this package's ops: gdn_cp (the default) and recurrent
    fla.py             FLA's entry, its op loaded on first use; interpreter.py lets it run under
                       TRITON_INTERPRET=1; fla_summary.py its summary hook, fla_kcp.py its KCP pair
    torch_fallback.py  transformers' entry: its torch_chunk_gated_delta_rule
    registry.py        the entries by name: `get_backend`, `register_backend` (which checks the op first),
                       `add_backend`
    checks.py          the op and seam checks against the fp64 reference (register_backend, bench doctor)
    mutants.py         an op broken on purpose, four ways, to prove those checks can fail
    plugins.py         backends from other packages: `gdn_cp.backends` entry points, modules by name
    findable.py        whether a backend's modules are installed, found without importing them
"""

from gdn_cp.ops.backends.entry import DEFAULT_BACKEND, Backend, KCPRule, RuleOp, SummaryOp
from gdn_cp.ops.backends.interpreter import InterpreterSupportError, support_interpreter
from gdn_cp.ops.backends.plugins import (
    BackendModuleError,
    BackendSource,
    backend_sources,
    import_backend_module,
    load_backend_plugins,
)
from gdn_cp.ops.backends.registry import (
    BUILT_IN,
    add_backend,
    backend_names,
    get_backend,
    is_known,
    names_unchecked,
    register_backend,
    unknown_backend,
    unregister_backend,
)

__all__ = [
    "BUILT_IN",
    "DEFAULT_BACKEND",
    "Backend",
    "BackendModuleError",
    "BackendSource",
    "InterpreterSupportError",
    "KCPRule",
    "RuleOp",
    "SummaryOp",
    "add_backend",
    "backend_names",
    "backend_sources",
    "get_backend",
    "import_backend_module",
    "is_known",
    "load_backend_plugins",
    "names_unchecked",
    "register_backend",
    "support_interpreter",
    "unknown_backend",
    "unregister_backend",
]
