"""The token-by-token Gated DeltaNet recurrence: the reference every fast path is checked against."""

from __future__ import annotations

from itertools import pairwise

import torch

from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.ops.documents import check_packed_batch, document_bounds
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
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """H_t = exp(g_t) (I - beta_t k_t k_t^T) H_{t-1} + beta_t k_t v_t^T, o_t = H_t^T q_t, token by token.

    Arguments, shapes and results: gdn_cp.ops.backends.RuleOp (FLA's signature; no chunk_size). o comes back
    in q's dtype, the final state(s) in the accumulation dtype.
    """
    if cu_seqlens is not None:
        return _per_document(
            q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens
        )
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


def _per_document(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    use_qk_l2norm_in_kernel: bool,
    cu_seqlens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference on packed documents: every document on its own, outputs concatenated."""
    check_gdn_inputs(q, k, v, g, beta)
    check_packed_batch(q.shape[0])
    bounds = document_bounds(cu_seqlens, q.shape[1])
    n, Hv, K, V = len(bounds) - 1, v.shape[2], k.shape[3], v.shape[3]
    if initial_state is not None and tuple(initial_state.shape) != (n, Hv, K, V):
        raise ValueError(
            f"initial_state must be [n, Hv, K, V] = {[n, Hv, K, V]} (one per document), got "
            f"{list(initial_state.shape)}"
        )
    outputs, finals = [], []
    for j, (a, b) in enumerate(pairwise(bounds)):
        o, h = recurrent_gated_delta_rule(
            *(x[:, a:b] for x in (q, k, v, g, beta)),
            scale=scale,
            initial_state=None if initial_state is None else initial_state[j : j + 1],
            output_final_state=True,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
        outputs.append(o)
        finals.append(h)
    return torch.cat(outputs, dim=1), (torch.cat(finals) if output_final_state else None)
