"""Context parallelism for GatedDeltaNet: platform, differentiable collectives, the mode registry (modes/),
the communication model, and LinearAttentionContextParallel."""

from gdn_cp.distributed.collectives import (
    all_gather_stack,
    all_reduce_gradients,
    all_to_all,
    all_to_all_single,
    exchange_halo,
    exchange_halo_with_lengths,
    state_chain,
)
from gdn_cp.distributed.comm_stats import CommStats, count_communication
from gdn_cp.distributed.context_parallel import LinearAttentionContextParallel
from gdn_cp.distributed.launch import RankFailure, default_threads_per_rank, local_rank, run_on_ranks
from gdn_cp.distributed.modes import (
    DEFAULT_MODE,
    MODES,
    SUMMARY_MODES,
    CPMode,
    ModeName,
    check_cp_shapes,
    mode_class,
    mode_order,
)
from gdn_cp.distributed.platform import DEVICES, Platform, PlatformError, resolve_platform
from gdn_cp.distributed.sharding import gather_sequence, shard_sequence

__all__ = [
    "DEFAULT_MODE",
    "DEVICES",
    "MODES",
    "SUMMARY_MODES",
    "CPMode",
    "CommStats",
    "LinearAttentionContextParallel",
    "ModeName",
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
    "exchange_halo_with_lengths",
    "gather_sequence",
    "local_rank",
    "mode_class",
    "mode_order",
    "resolve_platform",
    "run_on_ranks",
    "shard_sequence",
    "state_chain",
]
