"""Bytes a case moves between ranks, from the communication model of gdn_cp.distributed.comm_model.

Result files of `bench run` store no byte counts; the model gives them exactly from the case's own
configuration (mode, layer, cp, length, batch, pass, layout): `bench profile` counts every collective's bytes
on the wire beside the model and exits 3 where they differ, and tests/gdn_cp/distributed/test_comm_model.py
holds the counts equal to the model for every mode. The model knows nothing of packed documents: a packed case
moves what the same tokens unpacked move.
"""

from __future__ import annotations

from bench.suite.config import Case
from gdn_cp.distributed.comm_model import case_communication


def bytes_moved(case: Case) -> int:
    """Bytes sent plus received by the busiest rank in one pass of `case` (0 on one rank)."""
    per_rank = [
        sum(v["sent"] + v["received"] for v in case_communication(case.mode, case.comm_case(rank)).values())
        for rank in range(case.cp)
    ]
    return max(per_rank, default=0)
