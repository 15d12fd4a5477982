"""transformers' torch fallback of the Qwen3.5 gated delta rule (`torch_chunk_gated_delta_rule`) as a backend:
a peer reference computed in fp32, one sequence per call, q scaled by K^-1/2 (it takes no scale).

transformers decorates that function (`use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule",
"fla")`, 5.17 on): whenever `fla` imports, the module-level name calls FLA's Triton kernel instead, on a GPU
and a CPU alike; newer releases also wrap it in a dispatching module object. Backend "transformers" is
transformers' own torch path or nothing: the function defined in transformers' module is found behind the
wrappers (`functools.wraps` keeps it as `__wrapped__`; a wrapper object holds it in its forward's closure),
and anything else is refused with the line below.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from gdn_cp.ops.backends.entry import Backend

MODULE = "transformers.models.qwen3_5.modeling_qwen3_5"
NAME = "torch_chunk_gated_delta_rule"
TRANSFORMERS_SWAP_HINT = (
    "transformers switches to FLA's kernel when fla imports; run without fla on the path, or use backend=fla"
)
"""Why backend "transformers" may run another op, and what to do (gdn_cp.ops.backends.Backend.ran_as)."""


def load_torch_fallback():
    """transformers' own `torch_chunk_gated_delta_rule`, never the kernel its decorator swaps in; ImportError
    naming what to install when it is missing, RuntimeError when the torch function cannot be reached."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError as error:
        raise ImportError(
            f"backend 'transformers' needs transformers with Qwen3.5 ({error}): pip install 'transformers>=5'"
        ) from error
    function = _own_function(getattr(module, NAME))
    if function is None:
        raise RuntimeError(
            f"backend 'transformers': {MODULE}.{NAME} does not lead to transformers' torch function (this "
            f"transformers wraps it in a way gdn_cp does not know): {TRANSFORMERS_SWAP_HINT}"
        )
    return function


def _own_function(obj: object, depth: int = 4) -> Callable | None:
    """The plain function NAME defined in MODULE behind `obj`'s wrappers (None where there is none): `obj`
    itself, what `__wrapped__` names, or a function its forward / its own closure holds."""
    own = inspect.isfunction(obj) and (obj.__module__, obj.__name__) == (MODULE, NAME)
    if own and not hasattr(obj, "__wrapped__"):
        return obj
    if depth == 0:
        return None
    inner: list[object] = []
    if hasattr(obj, "__wrapped__"):
        inner.append(obj.__wrapped__)
    for holder in (obj, getattr(type(obj), "forward", None)):
        closure = getattr(holder, "__closure__", None) if inspect.isfunction(holder) else None
        inner += [c for c in map(_contents, closure or ()) if callable(c)]
    for candidate in inner:
        found = _own_function(candidate, depth - 1)
        if found is not None:
            return found
    return None


def _contents(cell: object) -> object:
    try:
        return cell.cell_contents  # type: ignore[attr-defined]
    except ValueError:  # an empty cell
        return None


TRANSFORMERS = Backend(
    name="transformers",
    description="transformers' torch fallback (torch_chunk_gated_delta_rule): a peer reference",
    load=load_torch_fallback,
    grouped_values=False,
    varlen=False,
    takes_scale=False,
    packages=("transformers",),
    modules=(MODULE,),
    source=("transformers.",),
    swapped_hint=TRANSFORMERS_SWAP_HINT,
)
"""Backend transformers' entry."""
