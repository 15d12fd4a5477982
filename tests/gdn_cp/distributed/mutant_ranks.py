"""Rank side of the mutant checks (gdn_cp.distributed.mutants): the tiny layer under CP on "state" inputs
packed in documents across rank edges, unbroken and with each mutant that applies to the mode on rank 1, in
fp32 and bf16. Spawned ranks import this module by name; every result is a picklable LayerComparison."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from gdn_cp import GatedDeltaNetConfig
from gdn_cp.accuracy import compare_layer_under_cp, edge_documents
from gdn_cp.distributed import MODES, mode_class, mutants

TOKENS_PER_RANK = 32
LAYER = {"hidden_size": 32, "head_k_dim": 8, "head_v_dim": 8, "chunk_size": 8}
"""The tiny layer (tests/bench/tiny.py's sizes), heads divisible by the world (ulysses runs too)."""
DTYPES = (torch.float32, torch.bfloat16)
SEED = 5


def layer_config(world: int, dtype: torch.dtype) -> GatedDeltaNetConfig:
    return GatedDeltaNetConfig(**LAYER, num_k_heads=world, num_v_heads=2 * world, dtype=dtype)


VARIANTS = ({}, {"checkpoint_summary": False}, {"overlap": True})
"""The local paths of the modes with a summary: checkpoint on (recomputed), off (kept), overlapped (split)."""


def run_world(world: int) -> dict[tuple[str, str, str, str | None], Any]:
    """(dtype, mode, variant, mutant name or None: unbroken) -> the comparison against the reference."""
    seq_len = TOKENS_PER_RANK * world
    documents = edge_documents(seq_len, world, "contiguous")
    out: dict[tuple[str, str, str, str | None], Any] = {}
    for dtype in DTYPES:
        config = layer_config(world, dtype)
        for mode in MODES:
            cls = mode_class(mode)
            for variant in VARIANTS if cls.has_summary else VARIANTS[:1]:
                for name in [None, *(m.name for m in mutants.applicable(cls, True))]:
                    key = (str(dtype).removeprefix("torch."), mode, str(variant), name)
                    with mutants.mutated(name) if name else contextlib.nullcontext():
                        out[key] = compare_layer_under_cp(
                            config,
                            mode=mode,
                            seq_len=seq_len,
                            seed=SEED,
                            documents=documents,
                            inputs="state",
                            **variant,
                        )
    return out
