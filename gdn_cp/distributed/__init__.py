"""Context parallelism for GatedDeltaNet: platform, differentiable collectives, and one module per mode."""

from gdn_cp.distributed.collectives import (
    all_gather_stack,
    all_reduce_gradients,
    all_to_all,
    all_to_all_single,
    exchange_halo,
    state_chain,
)
from gdn_cp.distributed.comm_stats import CommStats, count_communication
from gdn_cp.distributed.context_parallel import LinearAttentionContextParallel
from gdn_cp.distributed.launch import RankFailure, default_threads_per_rank, run_on_ranks
from gdn_cp.distributed.platform import DEVICES, Platform, PlatformError, resolve_platform
from gdn_cp.distributed.sharding import MODES, check_cp_shapes, gather_sequence, shard_sequence

__all__ = [
    "DEVICES",
    "MODES",
    "CommStats",
    "LinearAttentionContextParallel",
    "Platform",
    "PlatformError",
    "RankFailure",
    "all_gather_stack",
    "all_reduce_gradients",
    "all_to_all",
    "all_to_all_single",
    "check_cp_shapes",
    "count_communication",
    "default_threads_per_rank",
    "exchange_halo",
    "gather_sequence",
    "resolve_platform",
    "run_on_ranks",
    "shard_sequence",
    "state_chain",
]
