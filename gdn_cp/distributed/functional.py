"""The op-level entry to context parallelism: FLA's chunk_gated_delta_rule on this rank's sequence shard.

    o_local, final = cp_chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0,
                                               output_final_state=True, group=cp_group, mode="p2p",
                                               backend="fla")

Any model that computes q, k, v, g, beta on its own shard (its Conv1D included: that needs the halo, which
the layer-level GatedDeltaNet handles) can call it in place of the single-device op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from gdn_cp.distributed.context_parallel import as_process_group
from gdn_cp.distributed.modes import CPOptions, mode_class


def cp_chunk_gated_delta_rule(
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
    *,
    group: ProcessGroup | DeviceMesh | None = None,
    options: CPOptions | None = None,
    chunk_size: int = 64,
    **fields: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gdn_cp.ops.chunk_gated_delta_rule over the global sequence, on every rank of `group` with its shard.

    Args:
        q, k, v, g, beta, scale, use_qk_l2norm_in_kernel: as the op's (gdn_cp.ops.backends.RuleOp), for this
            rank's shard: L tokens in place of T (L may differ between ranks in the contiguous layout)
        initial_state: [B, Hv, K, V], or [n, Hv, K, V] with cu_seqlens (one per document); the same global
            tensor on every rank. Its gradient on each rank is partial, like a parameter's: their sum over the
            group is the single-device gradient (gdn_cp.distributed.all_reduce_gradients).
        output_final_state: also return the final state(s), shaped like initial_state, the same on every rank
        cu_seqlens: [n + 1] global document boundaries of the packed sequence (B = 1), the same on every rank;
            a document may span any number of ranks and a rank hold many
        group: the CP group (a ProcessGroup, a 1-D DeviceMesh, or None for WORLD)
        options: how CP runs (gdn_cp.distributed.CPOptions: mode, layout, checkpoint_summary, overlap,
            backend), given whole or by its fields (`mode="p2p", backend="fla"`); the default mode is ulysses
            (Hk and Hv divisible by cp), the default backend this package's op
        chunk_size: C
    Returns:
        o [B, L, Hv, V] this rank's output shard, as the single-device op's; the final state(s) or None.

    Bad input (malformed cu_seqlens, ranks passing different ones, B > 1 with cu_seqlens, an initial_state of
    the wrong shape, a zigzag T that does not divide by 2 cp) raises the same ValueError on every rank, after
    one small header exchange and before any collective that depends on it.
    """
    options = CPOptions.build(options, **fields)
    executor = mode_class(options.mode)(as_process_group(group), options)
    return executor.gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
