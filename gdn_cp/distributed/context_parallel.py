"""LinearAttentionContextParallel: the public way to put a GatedDeltaNet under context parallelism.

    layer = LinearAttentionContextParallel(mode="p2p").apply(layer, cp_group)
    y_local = layer(x_local)          # [B, T/cp, hidden] -> [B, T/cp, hidden]
    y_local = layer(x_local, cu_seqlens=cu)   # packed documents: global boundaries, the same on every rank
    ...backward...
    all_reduce_gradients(layer.parameters(), cp_group)   # or FSDP over the same ranks

It is a torch `ParallelStyle`, so torch's `parallelize_module` composes it with other styles over a 1-D
mesh, as torchtitan does:

    parallelize_module(model, cp_mesh, {"layers.0.linear_attn": LinearAttentionContextParallel(mode="p2p")})

Like torchtitan's parallel styles, `apply` changes the module in place and returns it. Parameters keep
their names and full shapes (a state_dict saved under CP loads without it); only the forward changes.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ParallelStyle

from gdn_cp.distributed.collectives import broadcast_module_tensors
from gdn_cp.distributed.modes import OPTION_FIELDS, CPOptions, check_cp_shapes, mode_class
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


def _source_rank(group: ProcessGroup, src_data_rank: int) -> int:
    """The global rank of `group`'s rank `src_data_rank`; ValueError with the fix when it is not one."""
    size = dist.get_world_size(group)
    if isinstance(src_data_rank, bool) or not isinstance(src_data_rank, int) or not 0 <= src_data_rank < size:
        raise ValueError(
            f"src_data_rank={src_data_rank!r} is not a rank of the CP group of {size} ranks: pass "
            f"parallelize_module(..., src_data_rank=r) with 0 <= r < {size}, or None to keep each rank's "
            "parameters"
        )
    return dist.get_global_rank(group, src_data_rank)


class LinearAttentionContextParallel(ParallelStyle):
    """Context parallelism for a GatedDeltaNet layer (design.md section 3), as a torch ParallelStyle.

    Built from one gdn_cp.distributed.CPOptions, given whole or by its fields:

        LinearAttentionContextParallel(mode="p2p", checkpoint_summary=False)
        LinearAttentionContextParallel(CPOptions(mode="scan", layout="zigzag"))

    What each option does is CPOptions' to say. The options are fixed at construction (`style.options`, and
    each field read as `style.mode`...; assigning raises AttributeError: build another style);
    `src_data_rank` is the one attribute `parallelize_module` sets on every call: the CP group rank whose
    parameters every rank takes (broadcast in `_apply`, so the layer computes what the single-device one
    does), or None to keep each rank's own. `apply` never broadcasts.
    """

    __slots__ = ("options", "src_data_rank")

    def __init__(self, options: CPOptions | None = None, /, **fields: Any) -> None:
        object.__setattr__(self, "options", CPOptions.build(options, **fields))
        object.__setattr__(self, "src_data_rank", 0)

    def __getattr__(self, name: str) -> Any:
        # style.mode, style.layout, ...: the options' fields, read-only
        if name in OPTION_FIELDS:
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        # Frozen but for src_data_rank, which parallelize_module assigns.
        if name != "src_data_rank":
            raise AttributeError(
                f"LinearAttentionContextParallel.{name} is read-only: build another style, e.g. "
                f"LinearAttentionContextParallel({name}={value!r})"
            )
        object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LinearAttentionContextParallel) and other.options == self.options

    def __hash__(self) -> int:
        return hash(self.options)

    def __repr__(self) -> str:
        return f"LinearAttentionContextParallel({self.options!r})"

    def apply(
        self,
        module: GatedDeltaNet,
        cp_group: ProcessGroup | DeviceMesh | None = None,
        *,
        tp_group: ProcessGroup | DeviceMesh | None = None,
    ) -> GatedDeltaNet:
        """Put `module` under CP over `cp_group` (a ProcessGroup, a 1-D DeviceMesh, or None for WORLD).

        Afterwards `module(x)` takes this rank's sequence shard [B, T/cp, hidden] (a tensor, or a DTensor
        with a Shard(1) placement) and returns its output shard. Parameters stay as they are on each rank
        (build them identically, e.g. from one seed). Raises NotImplementedError for a layer that is also
        tensor-parallel (a TP group of more than one rank, or parameters sharded on another mesh dim), and
        ValueError where the mode cannot split this layer's heads over the group.
        """
        if not isinstance(module, GatedDeltaNet):
            raise TypeError(
                f"LinearAttentionContextParallel applies to a GatedDeltaNet, got {type(module).__name__}: "
                "name the GatedDeltaNet itself (in a parallelize_module plan, e.g. 'layers.0.linear_attn')"
            )
        group = as_process_group(cp_group)
        if tp_group is not None and dist.get_world_size(as_process_group(tp_group)) > 1:
            raise NotImplementedError(
                "linear attention TP+CP is not supported yet: apply CP without a tensor-parallel group"
            )
        _check_not_tensor_parallel(module, group)
        executor = mode_class(self.options.mode)(group, self.options)
        check_cp_shapes(self.options.mode, module.config, executor.size)
        c = module.config
        device = module.in_proj_qkv.weight.device
        executor.check_backend(executor.backend(c.backend), device, c.dtype, c.chunk_size, c.head_k_dim)
        module.context_parallel = executor
        return module

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        """ParallelStyle's hook, called by `parallelize_module(module, device_mesh, plan)`: `apply` over the
        1-D `device_mesh`, then, unless src_data_rank is None, every rank takes that rank's parameters."""
        group = as_process_group(device_mesh)
        src = None if self.src_data_rank is None else _source_rank(group, self.src_data_rank)
        self.apply(module, device_mesh)
        if src is not None:
            broadcast_module_tensors(module, group, src)
        return module
