"""The Qwen3.5 Gated DeltaNet layer, with the parameter names and shapes of transformers'
Qwen3_5GatedDeltaNet.

A state_dict of that layer (`model.language_model.layers.<i>.linear_attn.*` in a checkpoint, prefix removed:
gdn_cp.layers.checkpoint finds it, in memory or on disk) loads into `GatedDeltaNet` with strict=True and
gives the same output. The forward is split into stages (project, convolve, gates, core, output) so that
context-parallel modes can recombine them; under `LinearAttentionContextParallel.apply` the forward is
handed to the mode, and parameters keep their names and full shapes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from gdn_cp.dtypes import current_precision, dtype_name, to_dtype
from gdn_cp.ops import (
    causal_conv1d,
    check_packed_batch,
    chunk_gdn_flops,
    conv_state,
    gated_rms_norm,
    gdn_gates,
    ran,
)
from gdn_cp.ops.backends import (
    DEFAULT_BACKEND,
    Backend,
    backend_names,
    get_backend,
    is_known,
    unknown_backend,
)


@dataclass(kw_only=True, slots=True, frozen=True)
class GatedDeltaNetConfig:
    """Sizes of one GDN layer. Names follow the layer; `from_hf_config` maps a transformers Qwen3.5 config."""

    hidden_size: int
    """Model width: input and output features."""
    num_k_heads: int
    """Query/key heads (Hk)."""
    num_v_heads: int
    """Value heads (Hv); a multiple of num_k_heads."""
    head_k_dim: int
    """Query/key head dim (K)."""
    head_v_dim: int
    """Value head dim (V)."""
    conv_kernel_size: int = 4
    """Width of the depthwise causal Conv1D on q, k, v."""
    rms_norm_eps: float = 1e-6
    """Epsilon of the gated RMSNorm."""
    chunk_size: int = 64
    """Chunk size of the chunked GDN."""
    dtype: torch.dtype | str = torch.float32
    """Parameter dtype; a torch.dtype or a name such as "bf16"."""
    backend: str = DEFAULT_BACKEND
    """The local op (gdn_cp.ops.backends): "gdn_cp" (this package's, any device and dtype), "fla"
    (flash-linear-attention's Triton kernels), "transformers" (its torch fallback), or a name registered with
    gdn_cp.ops.register_backend. Used by the layer on one device (prefill and decode too) and by every CP
    mode unless LinearAttentionContextParallel names another. A name nothing registered is refused here
    (a stored record is read under gdn_cp.ops.backends.names_unchecked: its name is data there)."""

    def __post_init__(self) -> None:
        for name in (f.name for f in fields(self) if f.type == "int"):  # every size: a positive integer
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GatedDeltaNetConfig.{name} must be a positive integer, got {value!r}")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"GatedDeltaNetConfig.num_v_heads {self.num_v_heads} is not a multiple of num_k_heads "
                f"({self.num_k_heads}); each key head serves num_v_heads // num_k_heads value heads, so "
                "choose a multiple"
            )
        if not self.rms_norm_eps > 0:
            raise ValueError(f"GatedDeltaNetConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        object.__setattr__(self, "dtype", to_dtype(self.dtype, "GatedDeltaNetConfig.dtype"))  # frozen
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError(
                f"GatedDeltaNetConfig.backend must be a backend's name, got {self.backend!r}; use one of "
                f"{', '.join(backend_names())}"
            )
        if not is_known(self.backend):  # a typo fails here, not at the first forward on every rank
            raise ValueError(f"GatedDeltaNetConfig.backend: {unknown_backend(self.backend)}")

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the fused projection and the Conv1D: [q | k | v]."""
        return 2 * self.key_dim + self.value_dim

    def flops(self, *, batch: int, seq_len: int, backward: bool) -> int:
        """Model FLOPs of one pass of the layer on [batch, seq_len] tokens: the four input projections and
        the output projection (2 T hidden x out each), the depthwise Conv1D (2 T conv_dim W), and the GDN
        core (gdn_cp.ops.chunk_gdn_flops); norms and gates are elementwise and not counted. Backward counts
        twice the forward, as the core's formula does."""
        tokens = batch * seq_len
        projections = 2 * tokens * self.hidden_size * (self.conv_dim + self.value_dim + 2 * self.num_v_heads)
        projections += 2 * tokens * self.value_dim * self.hidden_size
        conv = 2 * tokens * self.conv_dim * self.conv_kernel_size
        core = chunk_gdn_flops(
            batch=batch,
            seq_len=seq_len,
            num_k_heads=self.num_k_heads,
            num_v_heads=self.num_v_heads,
            head_k_dim=self.head_k_dim,
            head_v_dim=self.head_v_dim,
            chunk_size=self.chunk_size,
            backward=False,
        )
        return (projections + conv + core) * (3 if backward else 1)

    @classmethod
    def from_hf_config(cls, config: Any, **overrides: Any) -> GatedDeltaNetConfig:
        """From a transformers Qwen3.5 (text) config, or anything with its `linear_*` attributes."""
        config = getattr(config, "text_config", config)
        fields = {
            "hidden_size": config.hidden_size,
            "num_k_heads": config.linear_num_key_heads,
            "num_v_heads": config.linear_num_value_heads,
            "head_k_dim": config.linear_key_head_dim,
            "head_v_dim": config.linear_value_head_dim,
            "conv_kernel_size": config.linear_conv_kernel_dim,
            "rms_norm_eps": config.rms_norm_eps,
        }
        fields.update(overrides)
        return cls(**fields)


class GDNProjections(NamedTuple):
    """The input projections of a token shard."""

    mixed_qkv: torch.Tensor
    """[B, T, 2*Hk*K + Hv*V] fused q|k|v, before the convolution."""
    z: torch.Tensor
    """[B, T, Hv, V] output gate."""
    b: torch.Tensor
    """[B, T, Hv] beta logits."""
    a: torch.Tensor
    """[B, T, Hv] decay logits."""


class GDNState(NamedTuple):
    """What decoding continues from after a prefill: one entry per sequence (a batch row, or a document of
    a packed batch), in transformers' Qwen3.5 cache layout. Under CP every rank holds all of it."""

    conv_state: torch.Tensor
    """[N, 2*Hk*K + Hv*V, W] the last W tokens before the Conv1D (fused q|k|v), oldest first; zeros before
    the sequence's first token."""
    recurrent_state: torch.Tensor
    """[N, Hv, K, V] the GDN state after the last token, in the accumulation dtype (fp32; fp64 stays
    fp64)."""


class ShardForward(Protocol):
    """What runs a GatedDeltaNet's forward under context parallelism (a CP mode of gdn_cp.distributed):
    this rank's shard in, this rank's output shard out. Owned here so that layers never import distributed.
    """

    def __call__(
        self, layer: GatedDeltaNet, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def prefill(
        self, layer: GatedDeltaNet, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, GDNState]:
        """As `__call__`, and the whole sequence's final GDNState, the same on every rank."""
        ...


class GatedRMSNorm(nn.Module):
    """Holds `norm.weight` [V]; the math is gdn_cp.ops.gated_rms_norm."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)


class GatedDeltaNet(nn.Module):
    """Qwen3.5 Gated DeltaNet: hidden [B, T, hidden_size] -> [B, T, hidden_size]."""

    def __init__(self, config: GatedDeltaNetConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        get_backend(config.backend)  # an unknown name fails here, listing the registered ones
        self.config = config
        c = config
        kw = {"dtype": c.dtype, "device": device}
        self.in_proj_qkv = nn.Linear(c.hidden_size, c.conv_dim, bias=False, **kw)
        self.in_proj_z = nn.Linear(c.hidden_size, c.value_dim, bias=False, **kw)
        self.in_proj_b = nn.Linear(c.hidden_size, c.num_v_heads, bias=False, **kw)
        self.in_proj_a = nn.Linear(c.hidden_size, c.num_v_heads, bias=False, **kw)
        # Same module as transformers (padding included) so that checkpoints load; the forward uses only the
        # weight, through gdn_cp.ops.causal_conv1d.
        self.conv1d = nn.Conv1d(
            c.conv_dim,
            c.conv_dim,
            kernel_size=c.conv_kernel_size,
            groups=c.conv_dim,
            padding=c.conv_kernel_size - 1,
            bias=False,
            **kw,
        )
        self.dt_bias = nn.Parameter(torch.ones(c.num_v_heads, **kw))
        # As transformers initialises it: A in [0.01, 16], kept away from 0 so that log(A) is finite.
        self.A_log = nn.Parameter(torch.empty(c.num_v_heads, **kw).uniform_(0.01, 16).log_())
        self.norm = GatedRMSNorm(c.head_v_dim, c.rms_norm_eps, **kw)
        self.out_proj = nn.Linear(c.value_dim, c.hidden_size, bias=False, **kw)
        # Set by LinearAttentionContextParallel.apply; a plain attribute, so state_dict is unchanged.
        self.context_parallel: ShardForward | None = None

    def project(self, hidden_states: torch.Tensor) -> GDNProjections:
        """Input projections of [B, T, hidden_size] tokens (any shard of the sequence)."""
        B, T, _ = hidden_states.shape
        return GDNProjections(
            mixed_qkv=self.in_proj_qkv(hidden_states),
            z=self.in_proj_z(hidden_states).view(B, T, self.config.num_v_heads, self.config.head_v_dim),
            b=self.in_proj_b(hidden_states),
            a=self.in_proj_a(hidden_states),
        )

    def split_qkv(self, mixed_qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, T, 2*h_k*K + h_v*V] -> q, k [B, T, h_k, K], v [B, T, h_v, V] for any number of local heads.

        The head counts are read off the channels with the ratio Hv/Hk of the config, so this serves the full
        layer and a head shard alike.
        """
        c = self.config
        B, T, D = mixed_qkv.shape
        group = c.num_v_heads // c.num_k_heads
        h_k = D // (2 * c.head_k_dim + group * c.head_v_dim)
        q, k, v = mixed_qkv.split(
            [h_k * c.head_k_dim, h_k * c.head_k_dim, h_k * group * c.head_v_dim], dim=-1
        )
        return (
            q.view(B, T, h_k, c.head_k_dim),
            k.view(B, T, h_k, c.head_k_dim),
            v.view(B, T, -1, c.head_v_dim),
        )

    def gates(
        self, a: torch.Tensor, b: torch.Tensor, heads: slice = slice(None)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-decay g and beta [B, T, h] for the value heads `heads` (all by default)."""
        return gdn_gates(a, b, self.A_log[heads], self.dt_bias[heads])

    def core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        heads: slice = slice(None),
        cu_seqlens: torch.Tensor | Sequence[int] | None = None,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        backend: Backend | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Gates and the chunked GDN for the value heads `heads` (all by default), documents `cu_seqlens`,
        on `backend` (default: the config's): (o, final state or None). Shapes: gdn_cp.ops.backends.RuleOp."""
        g, beta = self.gates(a, b, heads)
        backend = get_backend(self.config.backend) if backend is None else backend
        return backend.rule(
            q,
            k,
            v,
            g,
            beta,
            initial_state=initial_state,
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu_seqlens,
            chunk_size=self.config.chunk_size,
        )

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Gated RMSNorm and output projection: o, z [B, T, Hv, V] -> [B, T, hidden_size]."""
        B, T = o.shape[:2]
        return self.out_proj(self.norm(o, z).reshape(B, T, self.config.value_dim))

    def forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """hidden_states [B, T, hidden_size] -> [B, T, hidden_size]; under CP, the local shard of both.

        cu_seqlens: [n + 1] boundaries of the documents packed in a batch of one (B = 1), as in FLA: the
        Conv1D and the recurrence restart at every document. Under CP they are the global boundaries, the
        same tensor on every rank.
        """
        if self.context_parallel is not None:
            return self.context_parallel(self, hidden_states, cu_seqlens)
        with self._call_scope(hidden_states):
            return self._run(hidden_states, cu_seqlens, final_state=False)[0]

    def prefill(
        self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, GDNState]:
        """The forward of a prompt, and the state decoding continues from (`decode`): hidden_states
        [B, T, hidden_size] -> ([B, T, hidden_size], GDNState of N = B sequences, or of the n documents of
        cu_seqlens). Run it under torch.inference_mode() when serving.

        Under CP, as the forward on this rank's shard, and every rank returns the whole sequence's state (one
        all-reduce of the states more than the forward), so that decoding may run on any rank.
        """
        if self.context_parallel is not None:
            return self.context_parallel.prefill(self, hidden_states, cu_seqlens)
        with self._call_scope(hidden_states):
            o, state = self._run(hidden_states, cu_seqlens, final_state=True)
        assert state is not None
        return o, state

    def decode(self, hidden_states: torch.Tensor, state: GDNState) -> tuple[torch.Tensor, GDNState]:
        """T more tokens of each of N sequences, continuing `state` (a prefill's or a decode's):
        hidden_states [N, T, hidden_size] -> ([N, T, hidden_size], the state after them). T = 1 is a decoding
        step; any T continues the sequences as if the prompt had been longer. Runs on this device alone,
        also under CP (every rank holds the whole state after a CP prefill)."""
        c = self.config
        if hidden_states.shape[0] != state.recurrent_state.shape[0]:
            raise ValueError(
                f"decode: hidden_states holds {hidden_states.shape[0]} sequences but the state "
                f"{state.recurrent_state.shape[0]}: pass one row per sequence (a packed prefill's documents "
                "become rows)"
            )
        p = self.project(hidden_states)
        before = state.conv_state.transpose(1, 2)  # [N, W, D], oldest first
        mixed = causal_conv1d(p.mixed_qkv, self.conv1d.weight, halo=before[:, 1:])
        q, k, v = self.split_qkv(mixed)
        o, final = self.core(q, k, v, p.a, p.b, initial_state=state.recurrent_state, output_final_state=True)
        assert final is not None
        window = conv_state(torch.cat([before.to(p.mixed_qkv.dtype), p.mixed_qkv], dim=1), c.conv_kernel_size)
        return self.output(o, p.z), GDNState(window, final)

    def _run(
        self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor | None, final_state: bool
    ) -> tuple[torch.Tensor, GDNState | None]:
        """The single-device forward, and with `final_state` the GDNState after it."""
        if cu_seqlens is not None:
            check_packed_batch(hidden_states.shape[0])
        p = self.project(hidden_states)
        q, k, v = self.split_qkv(causal_conv1d(p.mixed_qkv, self.conv1d.weight, cu_seqlens=cu_seqlens))
        o, final = self.core(q, k, v, p.a, p.b, cu_seqlens=cu_seqlens, output_final_state=final_state)
        out = self.output(o, p.z)
        if not final_state:
            return out, None
        assert final is not None
        return out, GDNState(conv_state(p.mixed_qkv, self.config.conv_kernel_size, cu_seqlens), final)

    def _call_scope(self, x: torch.Tensor) -> contextlib.AbstractContextManager[None]:
        """Record a call on this device alone, on input `x` (gdn_cp.ops.ran: no mode; the seam notes the
        op)."""
        return ran.call_scope(
            type(self).__name__,
            chunk_size=self.config.chunk_size,
            dtype=dtype_name(x.dtype),
            precision=current_precision(x.device.type),
        )

    def extra_repr(self) -> str:
        c = self.config
        heads = f"Hk={c.num_k_heads}, Hv={c.num_v_heads}, K={c.head_k_dim}, V={c.head_v_dim}"
        return f"hidden={c.hidden_size}, {heads}, conv={c.conv_kernel_size}, chunk={c.chunk_size}"


def seeded_layer(config: GatedDeltaNetConfig, seed: int, device: torch.device | str = "cpu") -> GatedDeltaNet:
    """A GatedDeltaNet whose weights depend on `seed` alone, whatever the device: initialised on the CPU from
    a generator seeded with `seed`, then moved to `device`. Drawn on the device, they would depend on its RNG
    (CUDA's, NPU's and the CPU's give other numbers), so ranks on different kinds of device, or a device rank
    and a CPU reference, would hold different layers. The caller's CPU RNG state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = GatedDeltaNet(config)
    return layer.to(device)
