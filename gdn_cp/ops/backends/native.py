"""This package's own ops as backends: `gdn_cp` (the chunked op, the default, with its summary hook and its
summaries-then-outputs pair from the chunk stages) and `recurrent` (the token-by-token reference)."""

from __future__ import annotations

import torch

from gdn_cp.ops.backends.entry import DEFAULT_BACKEND, Backend, KCPRule, RuleOp, SummaryOp
from gdn_cp.ops.chunk import chunk_gated_delta_rule, chunk_state_maps, summarise_chunks
from gdn_cp.ops.recurrent import recurrent_gated_delta_rule

ALL_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _load_gdn_cp() -> RuleOp:
    return chunk_gated_delta_rule


def _load_recurrent() -> RuleOp:
    return recurrent_gated_delta_rule


def _load_gdn_cp_summary() -> SummaryOp:
    return chunk_state_maps


def _load_gdn_cp_kcp() -> KCPRule:
    return summarise_chunks


GDN_CP = Backend(
    name=DEFAULT_BACKEND,
    description="this package's chunked op (eager torch, any device, fp64 too)",
    load=_load_gdn_cp,
    dtypes=ALL_DTYPES,
    source=("gdn_cp.ops.",),
    summary=_load_gdn_cp_summary,
    kcp=_load_gdn_cp_kcp,
)
"""Backend gdn_cp's entry."""

RECURRENT = Backend(
    name="recurrent",
    description="the token-by-token reference (gdn_cp.ops.recurrent_gated_delta_rule): exact and slow, "
    "for checks (bench's correctness gate compares every case with it)",
    load=_load_recurrent,
    dtypes=ALL_DTYPES,
    takes_chunk_size=False,
    source=("gdn_cp.ops.",),
)
"""Backend recurrent's entry."""
