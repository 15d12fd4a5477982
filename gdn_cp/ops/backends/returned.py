"""What a backend's op (or summary hook) returned, checked right after the call (gdn_cp.ops.backends.Backend
`rule` and `summarise`): a user's op one token short would otherwise fail later in a rank with
"The size of tensor a (127) must match the size of tensor b (128)", naming neither the backend nor the tensor.

Checked always: the result's form (a pair for the op), every tensor's shape, o's dtype (v's) and every
tensor's device (q's); a final state may be in any floating dtype (FLA's and gdn_cp's are fp32 for bf16
inputs). Not checked here: finiteness, which would read every output (a pass over it and, on a device, a
sync at every call); bench's correctness gate (bench.measure.gate) checks that the outputs are finite.
"""

from __future__ import annotations

import torch


def checked_result(
    backend: str, result: object, *, q: torch.Tensor, v: torch.Tensor, n: int, final: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(o, final state) of one call of `backend`'s op on q [B, T, Hk, K] and v [B, T, Hv, V] with n sequences
    (B, or the documents of its cu_seqlens); `final`: the final state was asked for (else it may be None).
    ValueError naming the backend, the tensor and what was expected otherwise."""
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise ValueError(
            f"backend {backend!r} returned {type(result).__name__}; expected (o, final_state), a pair "
            "(gdn_cp.ops.backends.RuleOp)"
        )
    o, state = result
    B, T, Hv, V = v.shape
    K = q.shape[-1]
    _check(backend, "o", o, (B, T, Hv, V), "[B, T, Hv, V]", q.device)
    if o.dtype != v.dtype:
        raise ValueError(
            f"backend {backend!r} returned o in {_named(o.dtype)}; expected {_named(v.dtype)} (v's)"
        )
    if final:
        _check(backend, "final_state", state, (n, Hv, K, V), "[N, Hv, K, V]", q.device)
    return o, state


def checked_maps(backend: str, maps: object, *, q: torch.Tensor, v: torch.Tensor, n: int) -> torch.Tensor:
    """The packed [S | M] a summary hook returned for n sequences of q [B, T, Hk, K], v [B, T, Hv, V],
    checked as `checked_result` checks a final state."""
    Hv, V = v.shape[2], v.shape[3]
    K = q.shape[-1]
    _check(backend, "summary", maps, (n, Hv, K, V + K), "[N, Hv, K, V + K]", q.device, what="summary hook")
    return maps  # type: ignore[return-value]


def _check(
    backend: str,
    name: str,
    tensor: object,
    expected: tuple[int, ...],
    legend: str,
    device: torch.device,
    what: str = "op",
) -> None:
    source = f"backend {backend!r}" + ("" if what == "op" else f"'s {what}")
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(
            f"{source} returned {name} as {type(tensor).__name__}; expected a tensor of shape {expected} "
            f"{legend}"
        )
    if tuple(tensor.shape) != expected:
        raise ValueError(
            f"{source} returned {name} of shape {tuple(tensor.shape)}; expected {expected} {legend}"
        )
    if tensor.device != device:
        raise ValueError(f"{source} returned {name} on {tensor.device}; expected {device} (q's device)")
    if not tensor.is_floating_point():
        raise ValueError(f"{source} returned {name} in {_named(tensor.dtype)}; expected a floating dtype")


def _named(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
