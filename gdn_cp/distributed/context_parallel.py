"""LinearAttentionContextParallel: the public way to put a GatedDeltaNet under context parallelism.

    layer = LinearAttentionContextParallel(mode="p2p").apply(layer, cp_group)
    y_local = layer(x_local)          # [B, T/cp, hidden] -> [B, T/cp, hidden]
    ...backward...
    all_reduce_gradients(layer.parameters(), cp_group)   # or FSDP over the same ranks

Like torchtitan's parallel styles, `apply` changes the module in place and returns it. Parameters keep
their names and full shapes (a state_dict saved under CP loads without it); only the forward changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from gdn_cp.distributed.modes import DEFAULT_MODE, check_cp_shapes, check_mode, mode_class
from gdn_cp.layers import GatedDeltaNet


def as_process_group(cp_group: ProcessGroup | DeviceMesh | None) -> ProcessGroup:
    """The ProcessGroup of a CP group given as a group, a 1-D DeviceMesh, or None (the default group)."""
    if cp_group is None:
        return dist.group.WORLD
    if isinstance(cp_group, DeviceMesh):
        if cp_group.ndim != 1:
            raise ValueError(
                f"the CP group must be a 1-D DeviceMesh; got a {cp_group.ndim}-D mesh: pass mesh['cp']"
            )
        return cp_group.get_group()
    return cp_group


def _same_ranks(a: ProcessGroup, b: ProcessGroup) -> bool:
    return dist.get_process_group_ranks(a) == dist.get_process_group_ranks(b)


def _check_not_tensor_parallel(module: nn.Module, group: ProcessGroup) -> None:
    """Refuse parameters sharded across ranks other than the CP group's (tensor parallelism)."""
    for name, p in module.named_parameters():
        if not isinstance(p, DTensor):
            continue
        mesh = p.device_mesh
        for dim, placement in enumerate(p.placements):
            if isinstance(placement, Replicate):
                continue
            dim_name = (mesh.mesh_dim_names or [None] * mesh.ndim)[dim]
            if (dim_name and "tp" in dim_name) or not _same_ranks(mesh.get_group(dim), group):
                raise NotImplementedError(
                    f"parameter {name!r} is sharded ({placement}) on mesh dim {dim_name or dim}: linear "
                    "attention TP+CP is not supported yet; apply CP to a layer without tensor parallelism"
                )


@dataclass(frozen=True, slots=True)
class LinearAttentionContextParallel:
    """Context parallelism for a GatedDeltaNet layer (design.md section 3)."""

    mode: str = DEFAULT_MODE
    """A name of gdn_cp.distributed.MODES: each mode's `description` says what crosses ranks; the first
    (the default) is ulysses, all-to-all to head shards."""
    checkpoint_summary: bool = True
    """Modes with a summary (SUMMARY_MODES): compute (S, M) under non-reentrant activation checkpointing
    (less peak memory, the summary recomputed in backward). No effect on the others."""

    def __post_init__(self) -> None:
        check_mode(self.mode)

    def apply(
        self,
        module: GatedDeltaNet,
        cp_group: ProcessGroup | DeviceMesh | None = None,
        *,
        tp_group: ProcessGroup | DeviceMesh | None = None,
    ) -> GatedDeltaNet:
        """Put `module` under CP over `cp_group` (a ProcessGroup, a 1-D DeviceMesh, or None for WORLD).

        Afterwards `module(x)` takes this rank's sequence shard [B, T/cp, hidden] (a tensor, or a DTensor
        with a Shard(1) placement) and returns its output shard. Raises NotImplementedError for a layer that
        is also tensor-parallel (a TP group of more than one rank, or parameters sharded on another mesh
        dim), and ValueError where the mode cannot split this layer's heads over the group.
        """
        if not isinstance(module, GatedDeltaNet):
            raise TypeError(
                f"LinearAttentionContextParallel applies to a GatedDeltaNet, got {type(module).__name__}"
            )
        group = as_process_group(cp_group)
        if tp_group is not None and dist.get_world_size(as_process_group(tp_group)) > 1:
            raise NotImplementedError(
                "linear attention TP+CP is not supported yet: apply CP without a tensor-parallel group"
            )
        _check_not_tensor_parallel(module, group)
        executor = mode_class(self.mode)(group, self.checkpoint_summary)
        check_cp_shapes(self.mode, module.config, executor.size)
        module.context_parallel = executor
        return module
