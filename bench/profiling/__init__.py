"""`bench profile`: where one case's step goes on every rank (time, communication volume, memory).

- rank.py: `profile_on_rank`, what every rank runs (count_communication vs the analytic model, MemTracker,
  torch.profiler with one Chrome trace per rank).
- traces.py: Chrome traces -> per-rank compute / collective / waiting times, the straggler and its phase.
"""

from bench.profiling.rank import MEMORY_METER, RankProfile, profile_on_rank
from bench.profiling.traces import (
    STEP_LABEL,
    RankBreakdown,
    RankTimeline,
    Straggler,
    breakdown,
    read_timeline,
    straggler,
)

__all__ = [
    "MEMORY_METER",
    "STEP_LABEL",
    "RankBreakdown",
    "RankProfile",
    "RankTimeline",
    "Straggler",
    "breakdown",
    "profile_on_rank",
    "read_timeline",
    "straggler",
]
