"""Argument checks and the common input preparation of every GDN op (shapes: see gdn_cp.ops)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.ops.norm import l2norm


def check_gdn_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> None:
    """Raise ValueError naming the argument whose shape, dtype or device does not fit the op's signature
    (gdn_cp.ops.backends.RuleOp): q, k, v of one floating dtype (the op's compute and output dtype); g, beta
    and initial_state floating (g and beta may be kept in fp32 beside bf16 q, k, v, as FLA allows); every
    tensor on one device.

    g is the log decay, <= 0 in the model (g = -exp(A_log) softplus(...)): the state is scaled by exp(g) per
    token. A positive g is not refused (checking it would read the tensor, a device sync) but amplifies the
    state, which overflows over long sequences.
    """
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    if initial_state is not None:
        named["initial_state"] = initial_state
    for name, t in named.items():
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(
            f"q, k, v must share one dtype (the op computes and returns it); got q {q.dtype}, k {k.dtype}, "
            f"v {v.dtype}: cast them alike, e.g. .to(torch.bfloat16)"
        )
    devices = {name: t.device for name, t in named.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} {device}" for name, device in devices.items())
        raise ValueError(f"every input must be on one device; got {listed}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "q, k, v must be 4-D [B, T, H, D]; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same shape [B, T, Hk, K]")
    B, T, Hk, K = k.shape
    if v.shape[:2] != (B, T):
        raise ValueError(f"v {tuple(v.shape)} must start with [B, T] = [{B}, {T}] like k")
    Hv, V = v.shape[2], v.shape[3]
    if Hv % Hk != 0:
        raise ValueError(f"v has {Hv} heads, which is not a multiple of the {Hk} query/key heads")
    for name, t in (("g", g), ("beta", beta)):
        if tuple(t.shape) != (B, T, Hv):
            raise ValueError(f"{name} must be [B, T, Hv] = [{B}, {T}, {Hv}], got {tuple(t.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (B, Hv, K, V):
        raise ValueError(
            f"initial_state must be [B, Hv, K, V] = [{B}, {Hv}, {K}, {V}], got {tuple(initial_state.shape)}"
        )


@dataclass(frozen=True, slots=True)
class HeadMajorInputs:
    """Inputs in the accumulation dtype, head-major. q is L2-normalised (if asked) and scaled; k
    L2-normalised (if asked). Key heads are not repeated: ops broadcast them over their value heads.
    """

    q: torch.Tensor  # [B, Hk, T, K]
    k: torch.Tensor  # [B, Hk, T, K]
    v: torch.Tensor  # [B, Hv, T, V]
    g: torch.Tensor  # [B, Hv, T]
    beta: torch.Tensor  # [B, Hv, T]


def head_major_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    use_qk_l2norm_in_kernel: bool,
) -> HeadMajorInputs:
    """Cast to the accumulation dtype, normalise and scale q/k, and lay out as [B, H, T, ...]."""
    acc = accumulation_dtype(q.dtype)
    K = q.shape[-1]
    q, k, v = (x.to(acc) for x in (q, k, v))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * (K**-0.5 if scale is None else scale)
    return HeadMajorInputs(
        q=q.transpose(1, 2),
        k=k.transpose(1, 2),
        v=v.transpose(1, 2),
        g=g.to(acc).transpose(1, 2),
        beta=beta.to(acc).transpose(1, 2),
    )
