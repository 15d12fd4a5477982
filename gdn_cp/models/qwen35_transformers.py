"""Context parallelism for transformers' Qwen3.5 models (Qwen3_5ForCausalLM, or anything holding a
Qwen3_5TextModel): every Gated DeltaNet layer under a gdn_cp mode, every full-attention layer under Ulysses.

    model = Qwen3_5ForCausalLM.from_pretrained(...)
    apply_context_parallel_to_qwen35(model, cp_mesh, mode="p2p")
    logits = model(input_ids=ids_shard, position_ids=global_positions_of_the_shard).logits

The model keeps its weights and parameter names (a state_dict saved under CP loads without it):
- each `linear_attn` (transformers' Qwen3_5GatedDeltaNet) is replaced by a gdn_cp GatedDeltaNet holding the
  same tensors, put under LinearAttentionContextParallel;
- full attention runs through an attention function registered with transformers (ATTENTION): query, key
  and value go Shard(sequence) -> Shard(head) by one all-to-all each, causal SDPA runs on the whole
  sequence for the local heads, and the output comes back (key/value heads are repeated when fewer than cp).

Each rank passes its contiguous sequence shard and the global positions of its tokens (`position_ids`,
for the rotary embedding). transformers' own loss (`labels=`) shifts labels inside the shard, which is
wrong at shard edges: compute the loss from the logits with labels shifted on the global sequence
(gdn_cp.models.Qwen35Hybrid's loss shows how). Not supported under CP: a KV/recurrent cache (generation) and
padding masks; both are refused.

This module imports transformers; gdn_cp itself does not need it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from transformers import AttentionInterface, AttentionMaskInterface

from gdn_cp.distributed.collectives import group_rank_size
from gdn_cp.distributed.context_parallel import LinearAttentionContextParallel, as_process_group
from gdn_cp.distributed.layout import DEFAULT_LAYOUT
from gdn_cp.distributed.modes import CPOptions
from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig
from gdn_cp.models.ulysses_attention import causal_attention, check_attention_heads

ATTENTION = "gdn_cp_ulysses"
"""The name of the Ulysses attention function (and of its mask function) in transformers' registries."""


def _ulysses_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q [B, H, L, D], k and v [B, Hkv, L, D] of this rank's
    tokens -> [B, L, H, D]. Causal over the global sequence; the (local) mask is not used."""
    group: ProcessGroup | None = getattr(module, "cp_group", None)
    if group is None:
        raise RuntimeError(
            f"attention implementation {ATTENTION!r} needs a CP group on the attention module: put the model "
            "under CP with apply_context_parallel_to_qwen35"
        )
    o = causal_attention(query, key, value, group, scale=scaling, dropout_p=dropout)
    return o.transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask function of ATTENTION: the attention is causal over the gathered sequence."""
    return None


AttentionInterface.register(ATTENTION, _ulysses_attention)
AttentionMaskInterface.register(ATTENTION, _no_mask)


class TransformersGatedDeltaNet(GatedDeltaNet):
    """gdn_cp's GatedDeltaNet called as transformers' Qwen3_5DecoderLayer calls its `linear_attn`."""

    def forward(  # type: ignore[override]
        self,
        hidden_states: torch.Tensor,
        cache: Any = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if cache is not None:
            raise NotImplementedError(
                "a Qwen3.5 model under context parallelism cannot use a cache (generation): call it with "
                "use_cache=False"
            )
        if attention_mask is not None and not bool(attention_mask.all()):
            raise NotImplementedError(
                "padding masks are not supported under context parallelism: pass unpadded sequences"
            )
        return super().forward(hidden_states)


def _text_config(model: nn.Module) -> Any:
    config = model.config
    return getattr(config, "text_config", config)


def use_gdn_cp_layers(model: nn.Module) -> nn.Module:
    """Replace every `linear_attn` of a transformers Qwen3.5 model by a TransformersGatedDeltaNet holding the
    same tensors (names, shapes, dtype, device), in place; returns the model. Without CP this computes what
    the model did (gdn_cp's chunked op in place of transformers' core)."""
    text = _text_config(model)
    replaced = 0
    for module in list(model.modules()):
        if hasattr(module, "linear_attn"):
            hf_layer = module.linear_attn
            weight = next(hf_layer.parameters())
            config = GatedDeltaNetConfig.from_hf_config(text, dtype=weight.dtype)
            ours = TransformersGatedDeltaNet(config, device=weight.device)
            ours.load_state_dict(hf_layer.state_dict(), strict=True)
            module.linear_attn = ours
            replaced += 1
    if not replaced and not any(hasattr(m, "self_attn") for m in model.modules()):
        raise TypeError(
            f"{type(model).__name__} has no Qwen3.5 decoder layers (modules with linear_attn or self_attn); "
            "pass a transformers Qwen3.5 model such as Qwen3_5ForCausalLM"
        )
    return model


def apply_context_parallel_to_qwen35(
    model: nn.Module,
    cp_group: ProcessGroup | DeviceMesh | None = None,
    options: CPOptions | None = None,
    /,
    **fields: Any,
) -> nn.Module:
    """Put a transformers Qwen3.5 model under CP over `cp_group`, in place (see the module docstring), with
    one CPOptions (given whole, or by its fields, as gdn_cp.models.apply_context_parallel).

    Returns the model. ValueError where the heads do not split over the group (full attention needs
    num_attention_heads divisible by cp; GDN layers follow the options' mode's rules).
    """
    style = LinearAttentionContextParallel(CPOptions.build(options, **fields))
    if style.options.layout != DEFAULT_LAYOUT:
        raise ValueError(
            f"apply_context_parallel_to_qwen35 takes contiguous shards only (its attention gathers them in "
            f"rank order), got layout={style.options.layout!r}: use layout={DEFAULT_LAYOUT!r}, or "
            "gdn_cp.models.Qwen35Hybrid for zigzag"
        )
    group = as_process_group(cp_group)
    _, cp = group_rank_size(group)
    text = _text_config(model)
    if "full_attention" in text.layer_types:
        check_attention_heads(text.num_attention_heads, cp)
    for module in use_gdn_cp_layers(model).modules():
        if isinstance(module, TransformersGatedDeltaNet):
            style.apply(module, group)
        elif hasattr(module, "self_attn"):
            module.self_attn.cp_group = group
    model.set_attn_implementation(ATTENTION)
    return model
