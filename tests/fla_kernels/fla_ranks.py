"""Rank-side checks of backend fla under CP (spawned ranks import this module by name): packed_ranks.op_case
with FLA's kernels, fp32, sizes FLA takes (head dims 16, chunks of 16). Backend fla runs its summaries-then-
outputs pair (FLA's KCP: the kcp paths); "fla_hooked" is FLA's op registered with only its summary hook, so
that the summary modes take the backend paths on FLA's kernels (recompute: the hook, the outputs at width V
and dS through one more call; affine: one call at V + K)."""

from __future__ import annotations

import torch

from gdn_cp.distributed import MODES, SUMMARY_MODES
from gdn_cp.ops import get_backend, register_backend
from gdn_cp.ops.backends.fla_summary import fla_state_maps
from tests.gdn_cp.distributed import packed_ranks

FLA = {"backend": "fla", "dtype": torch.float32, "dims": (16, 16), "chunk": 16}


def _register_hooked() -> None:
    """FLA's op with its hook and without its pair (per process: every rank registers it)."""
    register_backend(
        "fla_hooked",
        get_backend("fla").op(),
        dtypes=(torch.float32,),
        chunk_sizes=(16, 32, 64),
        takes_chunk_size=True,
        grouped_values=True,
        varlen=True,
        summary=fla_state_maps,
        check=False,  # FLA's op is what these tests check (test_fla_checks: its registration's check)
    )


def run_world(world: int) -> dict[tuple, dict[str, float]]:
    _register_hooked()
    T = 16 * world
    out = {}
    for mode in MODES:
        for checkpoint in (True, False) if mode in SUMMARY_MODES else (True,):
            out[(mode, "contiguous", checkpoint)] = packed_ranks.op_case(
                world, mode, checkpoint=checkpoint, tokens=T, **FLA
            )
    # documents across ranks, states in and out, zigzag; both backend paths
    documents = [0, 5, T // 2 + 3, T]
    out[("p2p", "zigzag-documents", False)] = packed_ranks.op_case(
        world, "p2p", layout="zigzag", documents=documents, checkpoint=False, **FLA
    )
    out[("scan", "zigzag-documents", True)] = packed_ranks.op_case(
        world, "scan", layout="zigzag", documents=documents, checkpoint=True, **FLA
    )
    out[("all_gather", "batch", True)] = packed_ranks.op_case(
        world, "all_gather", batch=2, checkpoint=True, tokens=T, **FLA
    )
    hooked = {**FLA, "backend": "fla_hooked"}
    for checkpoint in (True, False):  # the backend paths on FLA's kernels, documents across pieces
        out[("p2p", "hooked-zigzag-documents", checkpoint)] = packed_ranks.op_case(
            world, "p2p", layout="zigzag", documents=documents, checkpoint=checkpoint, **hooked
        )
    return out
