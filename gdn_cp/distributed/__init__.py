"""Context parallelism for GatedDeltaNet: platform, joining the process group on a rank (process_group),
differentiable collectives, the mode registry (modes/), the communication model, and
LinearAttentionContextParallel. Ranks are started by torchrun (or bench's launcher, bench.launch.local)."""

from gdn_cp.distributed.collectives import (
    all_reduce_gradients,
    all_to_all,
    all_to_all_single,
    exchange_halo,
    exchange_halos,
    exchange_header,
    sum_with_outputs,
)
from gdn_cp.distributed.comm_stats import CommStats, count_communication
from gdn_cp.distributed.context_parallel import LinearAttentionContextParallel
from gdn_cp.distributed.functional import cp_chunk_gated_delta_rule
from gdn_cp.distributed.layout import DEFAULT_LAYOUT, LAYOUTS, Layout, ShardPlan
from gdn_cp.distributed.modes import (
    DEFAULT_MODE,
    MODES,
    SUMMARY_MODES,
    CPMode,
    CPOptions,
    ModeName,
    check_cp_shapes,
    mode_class,
    mode_order,
)
from gdn_cp.distributed.platform import DEVICES, DeviceInfo, Platform, PlatformError, resolve_platform
from gdn_cp.distributed.process_group import (
    init_rank_group,
    local_rank,
    local_world_size,
    teardown_process_group,
)
from gdn_cp.distributed.sharding import check_layout_split, gather_sequence, shard_sequence
from gdn_cp.distributed.transfers import InFlight, all_gather_stack, shift_pieces, state_chain

__all__ = [
    "DEFAULT_LAYOUT",
    "DEFAULT_MODE",
    "DEVICES",
    "LAYOUTS",
    "MODES",
    "SUMMARY_MODES",
    "CPMode",
    "CPOptions",
    "CommStats",
    "DeviceInfo",
    "InFlight",
    "Layout",
    "LinearAttentionContextParallel",
    "ModeName",
    "Platform",
    "PlatformError",
    "ShardPlan",
    "all_gather_stack",
    "all_reduce_gradients",
    "all_to_all",
    "all_to_all_single",
    "check_cp_shapes",
    "check_layout_split",
    "count_communication",
    "cp_chunk_gated_delta_rule",
    "exchange_halo",
    "exchange_halos",
    "exchange_header",
    "gather_sequence",
    "init_rank_group",
    "local_rank",
    "local_world_size",
    "mode_class",
    "mode_order",
    "resolve_platform",
    "shard_sequence",
    "shift_pieces",
    "state_chain",
    "sum_with_outputs",
    "teardown_process_group",
]
