"""A Qwen3.5-style hybrid decoder: Gated DeltaNet and full-attention layers (3:1 by default).

Built like transformers' Qwen3.5 text model (zero-centred RMSNorm, SwiGLU MLP, gated attention output with
q/k norms and partial rotary embeddings), small enough for tests and accuracy runs. Under context
parallelism (gdn_cp.models.apply_context_parallel) each rank passes its sequence shard; rotary positions
are global, and the loss is this rank's share of the global mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import ProcessGroup

from gdn_cp.distributed.collectives import group_rank_size
from gdn_cp.distributed.layout import DEFAULT_LAYOUT, zigzag_order
from gdn_cp.dtypes import accumulation_dtype, to_dtype
from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig
from gdn_cp.models.ulysses_attention import causal_attention
from gdn_cp.ops import document_bounds, document_positions

LayerType = Literal["linear_attention", "full_attention"]


@dataclass(kw_only=True, slots=True)
class Qwen35HybridConfig:
    """Sizes of the hybrid model. Field names follow transformers' Qwen3_5TextConfig."""

    vocab_size: int = 256
    """Token vocabulary."""
    hidden_size: int = 64
    """Model width."""
    intermediate_size: int = 128
    """SwiGLU MLP width."""
    layer_types: tuple[LayerType, ...] = ("linear_attention",) * 3 + ("full_attention",)
    """Token mixer per layer, in order."""
    num_attention_heads: int = 4
    """Full-attention query heads."""
    num_key_value_heads: int = 2
    """Full-attention key/value heads (GQA)."""
    head_dim: int = 16
    """Full-attention head dim."""
    partial_rotary_factor: float = 0.25
    """Fraction of the attention head dim that is rotated (Qwen3.5: 0.25)."""
    rope_theta: float = 10_000.0
    """Rotary base."""
    linear_num_key_heads: int = 4
    """GDN query/key heads."""
    linear_num_value_heads: int = 8
    """GDN value heads."""
    linear_key_head_dim: int = 8
    """GDN query/key head dim."""
    linear_value_head_dim: int = 8
    """GDN value head dim."""
    linear_conv_kernel_dim: int = 4
    """GDN Conv1D width."""
    chunk_size: int = 64
    """GDN chunk size."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    dtype: torch.dtype | str = torch.float32
    """Parameter dtype."""
    gdn: GatedDeltaNetConfig = field(init=False)
    """The GDN layer config derived from the fields above."""

    def __post_init__(self) -> None:
        self.dtype = to_dtype(self.dtype, "Qwen35HybridConfig.dtype")
        self.layer_types = tuple(self.layer_types)
        unknown = sorted(set(self.layer_types) - {"linear_attention", "full_attention"})
        if unknown:
            raise ValueError(
                f"Qwen35HybridConfig.layer_types: unknown {unknown}; use linear_attention or full_attention"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"Qwen35HybridConfig.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if int(self.head_dim * self.partial_rotary_factor) % 2:
            raise ValueError("Qwen35HybridConfig.partial_rotary_factor * head_dim must be even")
        self.gdn = GatedDeltaNetConfig(
            hidden_size=self.hidden_size,
            num_k_heads=self.linear_num_key_heads,
            num_v_heads=self.linear_num_value_heads,
            head_k_dim=self.linear_key_head_dim,
            head_v_dim=self.linear_value_head_dim,
            conv_kernel_size=self.linear_conv_kernel_dim,
            rms_norm_eps=self.rms_norm_eps,
            chunk_size=self.chunk_size,
            dtype=self.dtype,
        )


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm (scale 1 + weight), computed in fp32 (fp64 for fp64), as Qwen3.5."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = accumulation_dtype(x.dtype)
        xf = x.to(acc)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.to(acc))).type_as(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class FullAttention(nn.Module):
    """Gated causal self-attention with q/k norms and partial rotary embeddings.

    Under CP (`cp_group` set) it is Ulysses: q, k, v go Shard(sequence) -> Shard(head) through one
    all-to-all each, causal SDPA runs on the full sequence for the local heads, and the output comes back.
    """

    def __init__(self, config: Qwen35HybridConfig) -> None:
        super().__init__()
        c = self.config = config
        d = c.dtype
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim * 2, bias=False, dtype=d)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False, dtype=d)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False, dtype=d)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False, dtype=d)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, d)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, d)
        rot = int(c.head_dim * c.partial_rotary_factor)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.cp_group: ProcessGroup | None = None
        self.layout: str = DEFAULT_LAYOUT  # with cp_group, set by apply_context_parallel

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B, L, H, D] at global `positions` [L]: rotate the first partial_rotary_factor of D."""
        freqs = positions[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None, :].to(x.dtype), emb.sin()[:, None, :].to(x.dtype)
        rot = emb.shape[-1]
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        c = self.config
        B, L, _ = x.shape
        q, gate = self.q_proj(x).view(B, L, -1, 2 * c.head_dim).chunk(2, dim=-1)
        q = self._rope(self.q_norm(q), positions)
        k = self._rope(self.k_norm(self.k_proj(x).view(B, L, -1, c.head_dim)), positions)
        v = self.v_proj(x).view(B, L, -1, c.head_dim)
        o = causal_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            self.cp_group,
            layout=self.layout,
            cu_seqlens=cu_seqlens,
        )
        o = o.transpose(1, 2).reshape(B, L, -1) * torch.sigmoid(gate.reshape(B, L, -1))
        return self.o_proj(o)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: Qwen35HybridConfig, layer_type: LayerType) -> None:
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config.gdn)
        else:
            self.self_attn = FullAttention(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, config.dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h = self.linear_attn(h, cu_seqlens=cu_seqlens)
        else:
            h = self.self_attn(h, positions, cu_seqlens)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridOutput(NamedTuple):
    logits: torch.Tensor
    """[B, L, vocab] for this rank's tokens."""
    loss: torch.Tensor | None
    """Cross-entropy summed over this rank's labelled tokens, divided by the labelled tokens of ALL ranks:
    the sum over ranks is the global mean (None without labels)."""


class Qwen35Hybrid(nn.Module):
    """input_ids [B, L] (a sequence shard under CP) -> logits [B, L, vocab] and the loss share."""

    def __init__(self, config: Qwen35HybridConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = nn.ModuleList(DecoderLayer(config, t) for t in config.layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=config.dtype)
        self.cp_group: ProcessGroup | None = None  # set by apply_context_parallel
        self.layout: str = DEFAULT_LAYOUT  # set by apply_context_parallel

    def positions(
        self, shard_len: int, cu_seqlens: torch.Tensor | None, device: torch.device
    ) -> torch.Tensor:
        """[L] rotary positions of this rank's tokens: global positions in the model's layout, restarting
        at every document with cu_seqlens (as packed training does, so a document reads as if alone)."""
        rank, cp = group_rank_size(self.cp_group) if self.cp_group is not None else (0, 1)
        if self.layout == "zigzag" and cp > 1:
            positions = zigzag_order(shard_len * cp, cp, device)[rank * shard_len : (rank + 1) * shard_len]
        else:
            positions = torch.arange(rank * shard_len, (rank + 1) * shard_len, device=device)
        if cu_seqlens is not None:
            positions = document_positions(document_bounds(cu_seqlens, shard_len * cp), device)[positions]
        return positions

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> HybridOutput:
        """Args:
        input_ids: [B, L] this rank's tokens (equal shards, in the model's layout)
        labels: [B, L] next-token targets already aligned with input_ids (shift the global sequence
            before sharding, so a shard's last label is the next shard's first token); -100 is ignored
        cu_seqlens: [n + 1] global boundaries of the documents packed in a batch of one (B = 1): no token
            mixer crosses them, and rotary positions restart at each
        """
        _, cp = group_rank_size(self.cp_group) if self.cp_group is not None else (0, 1)
        positions = self.positions(input_ids.shape[1], cu_seqlens, input_ids.device)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions, cu_seqlens)
        logits = self.lm_head(self.norm(x))
        if labels is None:
            return HybridOutput(logits, None)
        acc = accumulation_dtype(logits.dtype)
        loss_sum = F.cross_entropy(logits.to(acc).flatten(0, 1), labels.flatten(), reduction="sum")
        count = (labels != -100).sum()
        if cp > 1:
            dist.all_reduce(count, group=self.cp_group)
        return HybridOutput(logits, loss_sum / count.clamp(min=1))
