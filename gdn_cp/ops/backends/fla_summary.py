"""Backend fla's summary hook (gdn_cp.ops.backends.SummaryOp), from flash-linear-attention's own building
blocks (fla-core 0.6): its intra-chunk pass (`chunk_gated_delta_rule_fwd_intra`: K K^T, the UT transform, w
and u) and its KCP kernel that writes a sequence's packed [S | M] (`chunk_cp_fwd_kernel_h`,
fla.ops.cp.chunk_fwd: S as the state from zeros at width V, M as the K x K chain of the chunk maps, in fp32),
no outputs.

The kernel is launched directly, not through `chunk_cp_fwd_h`, whose device check admits only NVIDIA Ampere
or newer and Ascend (TF32x3 or IEEE fp32 dots in the M chain): Triton's interpreter, on a CPU, computes them
in fp32, which is what the check protects. Imported on first use, as the op is (gdn_cp.ops.backends.fla).
"""

from __future__ import annotations

import importlib

import torch


def fla_state_maps(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> torch.Tensor:
    """[N, Hv, K, V + K] fp32: the packed map [S | M] of each sequence (N = B, or the n sequences of
    cu_seqlens, B = 1), FLA's signature; q and scale are not read (the map does not involve the queries)."""
    del q, scale  # the map reads neither
    norm = importlib.import_module("fla.modules.norm.l2norm")
    utils = importlib.import_module("fla.ops.utils")
    constant = importlib.import_module("fla.ops.utils.constant")
    index = importlib.import_module("fla.ops.utils.index")
    intra = importlib.import_module("fla.ops.gated_delta_rule.chunk_fwd")
    B, T, _, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    k, v, g, beta = (x.contiguous() for x in (k, v, g, beta))  # FLA's kernels index contiguous memory
    if cu_seqlens is None:  # every row a sequence: FLA's varlen layout, B = 1
        k, v, g, beta = (x.reshape(1, B * T, *x.shape[2:]) for x in (k, v, g, beta))
        cu_seqlens = torch.arange(0, B * T + 1, T, dtype=torch.long, device=k.device)
    cu_seqlens = torch.as_tensor(cu_seqlens, dtype=torch.long, device=k.device)
    N = len(cu_seqlens) - 1
    if use_qk_l2norm_in_kernel:
        k, _ = norm.l2norm_fwd(k)
    chunk_indices = index.prepare_chunk_indices(cu_seqlens, chunk_size)
    g = utils.chunk_local_cumsum(
        g, chunk_size=chunk_size, scale=constant.RCP_LN2, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices
    )
    w, u, _ = intra.chunk_gated_delta_rule_fwd_intra(
        k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=chunk_size
    )
    hm = torch.zeros(N, HV, K, V + K, dtype=torch.float32, device=k.device)
    state_maps(k, w, u, g, cu_seqlens, hm, chunk_size)
    return hm


def state_maps(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    g: torch.Tensor,
    cu_seqlens: torch.Tensor,
    hm: torch.Tensor,
    chunk_size: int,
    maps: bool = True,
) -> None:
    """Write into hm the packed [S | M] ([N, Hv, K, V + K], fp32) of the sequences of cu_seqlens ([N + 1]),
    from FLA's prepared k, w, u and chunk-cumulated log2 gates g ([1, T, ...]), with FLA's KCP kernel;
    maps=False: S only (the programs of the M columns are not launched; hm's M stays as it is)."""
    kcp = importlib.import_module("fla.ops.cp.chunk_fwd")
    triton = importlib.import_module("triton")
    H, K = k.shape[2], k.shape[3]
    HV, V = u.shape[2], u.shape[3]
    BV = 32 if K <= 64 else 64  # as chunk_cp_fwd_h launches it
    columns = triton.cdiv(V, BV) + (triton.cdiv(K, BV) if maps else 0)
    kcp.chunk_cp_fwd_kernel_h[(columns, HV, len(cu_seqlens) - 1)](
        k=k,
        v=u,
        w=w,
        g=g,
        gk=None,
        bg=None,
        u=u,
        hm=hm,
        cu_seqlens=cu_seqlens,
        T=0,
        H=H,
        HV=HV,
        K=K,
        V=V,
        BT=chunk_size,
        BV=BV,
        BK=triton.next_power_of_2(K),
        MULTI_SEQS=True,
    )


def load_fla_summary():
    """The hook, after the op has loaded (which prepares Triton's interpreter where it runs)."""
    return fla_state_maps
