"""How many bytes each CP mode moves per rank and step: the analytic model that measured counts
(gdn_cp.distributed.comm_stats) are checked against. Each mode states its own part (its `communication`
classmethod, in gdn_cp.distributed.modes); this is the one entry point.

Notation: B batch, L = T / cp local tokens, e the parameter dtype's bytes, s the state dtype's bytes (fp32,
or fp64 for fp64 layers), D = 2 Hk K + Hv V the conv channels, w = conv_kernel_size - 1. On one rank
nothing is exchanged.
"""

from __future__ import annotations

from gdn_cp.distributed.comm_stats import Volume
from gdn_cp.distributed.layout import DEFAULT_LAYOUT
from gdn_cp.distributed.modes import CommCase, mode_class
from gdn_cp.layers import GatedDeltaNetConfig


def layer_communication(
    mode: str,
    config: GatedDeltaNetConfig,
    *,
    cp: int,
    rank: int,
    seq_len: int,
    batch: int = 1,
    backward: bool = True,
    layout: str = DEFAULT_LAYOUT,
    final_states: int = 0,
) -> Volume:
    """Bytes rank `rank` sends and receives in one forward (and backward) of a GatedDeltaNet under CP, its
    sequence cut evenly in `layout`; a prefill (no backward) adds the sum of its `final_states` states."""
    case = CommCase(
        config,
        cp=cp,
        rank=rank,
        seq_len=seq_len,
        batch=batch,
        backward=backward,
        layout=layout,
        final_states=final_states,
    )
    return case_communication(mode, case)


def case_communication(mode: str, case: CommCase) -> Volume:
    """`layer_communication` of a CommCase (one rank of one pass); nothing on one rank."""
    cls = mode_class(mode)
    return {} if case.cp == 1 else cls.communication(case)
