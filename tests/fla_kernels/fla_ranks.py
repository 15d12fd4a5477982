"""Rank-side checks of backend fla under CP (spawned ranks import this module by name): packed_ranks.op_case
with FLA's kernels, fp32, sizes FLA takes (head dims 16, chunks of 16)."""

from __future__ import annotations

import torch

from gdn_cp.distributed import MODES, SUMMARY_MODES
from tests.distributed import packed_ranks

FLA = {"backend": "fla", "dtype": torch.float32, "dims": (16, 16), "chunk": 16}


def run_world(world: int) -> dict[tuple, dict[str, float]]:
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
    return out
