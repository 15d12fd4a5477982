"""The token-by-token Gated DeltaNet recurrence: the reference every fast path is checked against."""

from __future__ import annotations

import torch

from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.ops.inputs import check_gdn_inputs, head_major_inputs


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """H_t = exp(g_t) (I - beta_t k_t k_t^T) H_{t-1} + beta_t k_t v_t^T, o_t = H_t^T q_t, token by token.

    Args:
        q: [B, T, Hk, K]
        k: [B, T, Hk, K]
        v: [B, T, Hv, V]
        g: [B, T, Hv] log-decay (<= 0)
        beta: [B, T, Hv]
        scale: multiplies q; default K ** -0.5
        initial_state: [B, Hv, K, V] or None (zeros)
        output_final_state: also return H_T
        use_qk_l2norm_in_kernel: L2-normalise q and k first
    Returns:
        o [B, T, Hv, V] in q's dtype; H_T [B, Hv, K, V] in the accumulation dtype, or None.
    """
    check_gdn_inputs(q, k, v, g, beta, initial_state)
    x = head_major_inputs(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel)
    B, Hv, T, V = x.v.shape
    K = x.k.shape[-1]
    group = Hv // x.k.shape[1]
    xq, xk = x.q.repeat_interleave(group, dim=1), x.k.repeat_interleave(group, dim=1)
    acc = accumulation_dtype(q.dtype)
    if initial_state is None:
        h = x.v.new_zeros(B, Hv, K, V)
    else:
        h = initial_state.to(acc)
    outputs = []
    for t in range(T):
        k_t = xk[:, :, t]  # [B, Hv, K]
        h = h * x.g[:, :, t].exp()[..., None, None]
        delta = (x.v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k_t, h)) * x.beta[:, :, t, None]
        h = h + k_t[..., None] * delta[..., None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", xq[:, :, t], h))
    o = torch.stack(outputs, dim=1) if outputs else x.v.new_zeros(B, 0, Hv, V)
    return o.to(q.dtype), (h if output_final_state else None)
