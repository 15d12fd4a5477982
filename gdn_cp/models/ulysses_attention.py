"""Causal softmax attention under Ulysses CP, the full-attention half of a hybrid model's context parallelism.

Each rank holds its sequence shard of every head; one all-to-all per tensor turns that into the whole
sequence of cp-th of the heads (Shard(sequence) -> Shard(head)), causal SDPA runs there, and one more
all-to-all turns the output back. Key/value heads that do not split over the ranks are repeated to the
query heads first. Without a group (or on one rank) it is plain causal SDPA.

Layouts: a zigzag sequence arrives in rank order and is put in global order for the causal mask, then back
(gdn_cp.distributed.layout). Packed documents (cu_seqlens): a token attends to earlier tokens of its own
document only.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup

from gdn_cp.distributed.collectives import all_to_all, group_rank_size
from gdn_cp.distributed.layout import DEFAULT_LAYOUT, check_layout, zigzag_order
from gdn_cp.ops import document_bounds


def check_attention_heads(num_attention_heads: int, cp: int) -> None:
    """ValueError, with the fix, unless the query heads split over cp ranks."""
    if num_attention_heads % cp:
        raise ValueError(
            f"full attention shards heads over cp={cp}, but num_attention_heads={num_attention_heads} is not "
            f"divisible by {cp}; choose a cp that divides it"
        )


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: ProcessGroup | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    *,
    layout: str = DEFAULT_LAYOUT,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of this rank's tokens over the global sequence.

    Args:
        q: [B, H, L, D] this rank's shard of the query heads (equal shards, in `layout`)
        k, v: [B, Hkv, L, D] (H a multiple of Hkv)
        group: the CP group (None: no CP)
        scale: softmax scale, default D ** -0.5
        layout: how the sequence is cut over the ranks (gdn_cp.distributed.LAYOUTS)
        cu_seqlens: [n + 1] global document boundaries (B = 1): attention stays inside each document
    Returns:
        [B, H, L, D]
    """
    check_layout(layout)
    _, cp = group_rank_size(group) if group is not None else (0, 1)
    order = None
    if cp > 1:
        heads, kv_heads = q.shape[1], k.shape[1]
        if kv_heads % cp:  # too few key/value heads to shard: give every query head its own
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
        q, k, v = (all_to_all(t, scatter_dim=1, gather_dim=2, group=group) for t in (q, k, v))
        if layout == "zigzag":
            order = zigzag_order(q.shape[2], cp, q.device)  # global position of each gathered token
            q, k, v = (t.index_select(2, torch.argsort(order)) for t in (q, k, v))
    mask = None
    if cu_seqlens is not None:
        T = q.shape[2]
        bounds = document_bounds(cu_seqlens, T)
        lengths = torch.tensor([b - a for a, b in pairwise(bounds)], device=q.device)
        document = torch.repeat_interleave(torch.arange(len(lengths), device=q.device), lengths)
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        mask = causal & (document[:, None] == document[None, :])
    o = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        dropout_p=dropout_p,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    if order is not None:
        o = o.index_select(2, order)
    if cp > 1:
        o = all_to_all(o, scatter_dim=2, gather_dim=1, group=group)
    return o
