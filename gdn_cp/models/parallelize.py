"""Context parallelism for the hybrid model: GDN layers through LinearAttentionContextParallel, full
attention through Ulysses, as the PR did (torchtitan style: change the model in place and return it)."""

from __future__ import annotations

from typing import Any

from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from gdn_cp.distributed.collectives import group_rank_size
from gdn_cp.distributed.context_parallel import LinearAttentionContextParallel, as_process_group
from gdn_cp.distributed.modes import CPOptions
from gdn_cp.models.qwen35_hybrid import Qwen35Hybrid
from gdn_cp.models.ulysses_attention import check_attention_heads


def apply_context_parallel(
    model: Qwen35Hybrid,
    cp_group: ProcessGroup | DeviceMesh | None = None,
    options: CPOptions | None = None,
    /,
    **fields: Any,
) -> Qwen35Hybrid:
    """Put every layer of `model` under CP over `cp_group` with one CPOptions (given whole, or by its
    fields: `apply_context_parallel(model, group, mode="p2p", layout="zigzag")`); afterwards the model takes
    sequence shards cut in the options' layout (zigzag balances full attention's causal work, and every
    layer, GDN included, takes it as it is: no re-shard between layers).

    Full attention needs num_attention_heads divisible by cp (key/value heads are repeated when they are
    fewer than cp); GDN layers follow the rules of the options' mode.
    """
    style = LinearAttentionContextParallel(CPOptions.build(options, **fields))
    group = as_process_group(cp_group)
    _, cp = group_rank_size(group)
    c = model.config
    if any(t == "full_attention" for t in c.layer_types):
        check_attention_heads(c.num_attention_heads, cp)
    layout = style.options.layout
    for layer in model.layers:
        if layer.layer_type == "linear_attention":
            style.apply(layer.linear_attn, group)
        else:
            layer.self_attn.cp_group = group
            layer.self_attn.layout = layout
    model.cp_group, model.layout = group, layout
    return model
