"""The base of every CP mode: the call boundary of a GatedDeltaNet under context parallelism, and the facts
a mode declares about itself (read through the registry, gdn_cp.distributed.modes).

A mode runs at two levels, on this rank's shard in the mode's layout (gdn_cp.distributed.layout):
- the layer (`__call__` / `forward_shard`): hidden states in, hidden states out, optionally packed documents;
  `prefill` adds the whole sequence's final GDNState (conv and recurrent states), the same on every rank;
- the op (`gated_delta_rule`, public as gdn_cp.distributed.cp_chunk_gated_delta_rule): q, k, v, g, beta in,
  outputs and final states out, as gdn_cp.ops.chunk_gated_delta_rule on the whole sequence.
The base class handles what all modes share: DTensor inputs (a Shard(1) placement; its local shard is used and
the output is wrapped back), and the header every mode exchanges first (gdn_cp.distributed.header): the
local input checks' verdict and the call's signature, so that a bad input, or ranks that call differently,
raise on every rank together.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor, Shard

from gdn_cp.distributed.collectives import exchange_header, group_rank_size, sum_with_outputs
from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.header import CallSignature, agree, check_local_input, header_words, plan_documents
from gdn_cp.distributed.layout import DEFAULT_LAYOUT, ShardPlan
from gdn_cp.dtypes import accumulation_dtype, current_precision, dtype_name
from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig, GDNState
from gdn_cp.ops import ran
from gdn_cp.ops.backends import DEFAULT_BACKEND, Backend, get_backend
from gdn_cp.ops.inputs import check_gdn_inputs

if TYPE_CHECKING:
    from gdn_cp.distributed.modes import CPOptions


@dataclass(frozen=True, slots=True)
class CommCase:
    """What one rank's communication in one pass depends on (the communication model's input)."""

    config: GatedDeltaNetConfig
    cp: int
    """Ranks; > 1."""
    rank: int
    """This rank, 0 .. cp - 1."""
    seq_len: int
    """Global tokens (each rank holds seq_len / cp)."""
    batch: int
    backward: bool
    """Forward and backward (else the forward alone)."""
    layout: str = DEFAULT_LAYOUT
    """How the sequence is cut over the ranks (gdn_cp.distributed.layout)."""
    final_states: int = 0
    """Sequences whose final GDNState the pass returns (a prefill, `CPMode.prefill`: the batch, or the
    documents packed in it); 0: none (training)."""


class CPMode(ABC):
    """Runs a GatedDeltaNet on a sequence shard. Subclasses set the class facts and implement
    `layer_shard` (the layer on this rank's shard), `sharded_rule` (the op on it) and `communication`
    (what a case moves between ranks); `forward_shard` and `prefill` are the calls built on them."""

    name: ClassVar[str]
    """The mode's name in configs, results and the CLI."""
    description: ClassVar[str]
    """One line: what crosses ranks."""
    has_summary: ClassVar[bool]
    """Whether the mode computes the affine (S, M) summary, so that checkpoint_summary and overlap apply."""

    def __init__(self, group: ProcessGroup | None, options: CPOptions) -> None:
        self.group = group
        self.rank, self.size = group_rank_size(group)
        self.options = options
        """How this mode runs (gdn_cp.distributed.modes.CPOptions): layout, checkpoint, overlap, backend."""

    @property
    def layout(self) -> str:
        return self.options.layout

    def backend(self, config_backend: str = DEFAULT_BACKEND) -> Backend:
        """The local op: the options' backend, else `config_backend` (the layer's own)."""
        return get_backend(self.options.backend or config_backend)

    # -- facts, for validation, estimates and the communication model -------------------------------------

    @classmethod
    def check_shapes(cls, config: GatedDeltaNetConfig, cp_size: int) -> None:
        """Raise ValueError, with the fix, if this mode cannot split `config` over `cp_size` ranks (the
        base: every split works)."""
        return

    @classmethod
    def local_path(cls, options: CPOptions, backend: Backend) -> str:
        """How a rank of this mode computes its local op under `options` on `backend` (memory estimates,
        and the mode's own dispatch): "whole" here, one call of the op on what the rank holds; the summary
        modes' paths are SequenceShardMode.local_path's."""
        return "whole"

    @classmethod
    def checkpoint_for(cls, options: CPOptions, backend: Backend) -> bool:
        """checkpoint_summary as this mode applies it on `backend` (None resolved; the summary modes:
        SequenceShardMode.checkpoint_for); a mode without a summary ignores it: the option, False for None."""
        return bool(options.checkpoint_summary)

    @classmethod
    def held_summaries(cls, cp_size: int) -> int:
        """Packed [S | M] summaries of other ranks this rank holds at once (memory estimates)."""
        return 0

    @classmethod
    @abstractmethod
    def communication(cls, case: CommCase) -> Volume:
        """Bytes the case's rank sends and receives in one pass at cp > 1 (gdn_cp.distributed.comm_model
        documents the notation)."""

    @staticmethod
    def header_volume(volume: Volume, case: CommCase) -> None:
        """Add the header every call starts with (gdn_cp.distributed.header): one all-gather of
        8 header_words() bytes from and to every other rank."""
        header = 8 * header_words() * (case.cp - 1)
        add_volume(volume, "all_gather", header, header)

    @staticmethod
    def final_state_volume(volume: Volume, case: CommCase) -> None:
        """Add a prefill's state sum (`prefill`), when the case returns final states: one all-reduce of the
        packed [conv | recurrent] states, N (D W + Hv K V) s bytes (N sequences, W the kernel, s the state
        dtype's)."""
        if not case.final_states:
            return
        c = case.config
        s = torch.empty((), dtype=accumulation_dtype(c.dtype)).element_size()
        elements = c.conv_dim * c.conv_kernel_size + c.num_v_heads * c.head_k_dim * c.head_v_dim
        state = case.final_states * elements * s
        add_volume(volume, "all_reduce", state, state)

    @classmethod
    def exchange_flops(cls, case: CommCase) -> int:
        """FLOPs this rank spends combining what the exchange brought (folds, compositions), in one pass:
        the compute that grows with cp on top of the local op's (the cost model; the base: none)."""
        return 0

    @classmethod
    def critical_path(cls, case: CommCase) -> dict[str, tuple[int, float]]:
        """The transfers on the case's rank's path through one pass, per kind: (calls, bytes this rank puts on
        the wire per call), calls following one another, each waiting for the one before (so latencies add;
        the cost model, bench.model, prices them). The base: the rank's own calls (`communication`), for
        modes whose exchanges are collectives every rank joins at once; a mode whose messages are relayed
        rank to rank overrides it."""
        return {
            kind: (v["calls"], v["sent"] / v["calls"])
            for kind, v in cls.communication(case).items()
            if v["calls"]
        }

    # -- the call -------------------------------------------------------------------------------------------

    def __call__(
        self, layer: GatedDeltaNet, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        placement = None
        if isinstance(hidden_states, DTensor):
            placement = (hidden_states.device_mesh, hidden_states.placements)
            if not any(isinstance(p, Shard) and p.dim == 1 for p in hidden_states.placements):
                raise ValueError(
                    f"a DTensor input to a CP layer must be sharded on the sequence dim (Shard(1)); got "
                    f"{hidden_states.placements}"
                )
            hidden_states = hidden_states.to_local()
        with self.call_scope(type(layer).__name__, hidden_states, layer.config.chunk_size):
            out = self.forward_shard(layer, hidden_states, cu_seqlens)
        if placement is not None:
            out = DTensor.from_local(out, placement[0], placement[1], run_check=False)
        return out

    def forward_shard(
        self, layer: GatedDeltaNet, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [B, L, hidden] this rank's shard -> [B, L, hidden]; cu_seqlens: global document boundaries
        (B = 1), the same on every rank."""
        return self.layer_shard(layer, x, cu_seqlens, final_state=False)[0]

    def prefill(
        self, layer: GatedDeltaNet, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, GDNState]:
        """`forward_shard`, and the whole sequence's final GDNState (N = B, or the n documents of
        cu_seqlens), the same on every rank: each rank's share of both states (zeros where another rank
        holds the tokens or heads) summed in one all-reduce, in the state dtype (the conv tokens cross it
        exactly: each slot is one rank's value plus zeros)."""
        with self.call_scope(type(layer).__name__, x, layer.config.chunk_size):
            out, shares = self.layer_shard(layer, x, cu_seqlens, final_state=True)
        assert shares is not None
        conv, state = shares
        packed = torch.cat([conv.to(state.dtype).flatten(1), state.flatten(1)], dim=1)
        out, packed = sum_with_outputs(out, packed, self.group)
        conv_total, state_total = packed.split([conv[0].numel(), state[0].numel()], dim=1)
        return out, GDNState(conv_total.view_as(conv).to(conv.dtype), state_total.view_as(state))

    def call_scope(
        self, call: str, x: torch.Tensor, chunk_size: int
    ) -> contextlib.AbstractContextManager[None]:
        """Record this call (gdn_cp.ops.ran) on input `x`: the mode, its options as applied, the dtype it
        computes in (x's: under mixed precision the parameters' own may differ), the device's matmul
        precision; the local path is noted where `sharded_rule` takes it, the ops where the seam calls
        them."""
        return ran.call_scope(
            call,
            mode=self.name,
            mode_class=ran.qualified_name(type(self)),
            layout=self.layout,
            checkpoint_summary=self.options.checkpoint_summary,
            overlap=self.options.overlap,
            chunk_size=chunk_size,
            dtype=dtype_name(x.dtype),
            precision=current_precision(x.device.type),
        )

    def signature(self, backend: Backend, **call: object) -> CallSignature:
        """This call's CallSignature: the mode's own settings, the backend it resolved, and `call`'s fields
        (the config, dtype and options every rank must pass alike)."""
        return CallSignature(
            mode=self.name,
            layout=self.layout,
            checkpoint_summary=self.checkpoint_for(self.options, backend),
            overlap=self.options.overlap,
            backend=backend.name,
            **call,
        )

    def check_backend(
        self,
        backend: Backend,
        device: torch.device,
        dtype: torch.dtype,
        chunk_size: int,
        head_k_dim: int,
        scale: float | None = None,
    ) -> None:
        """ValueError, with the fix, if this mode cannot run the call's local op on `backend` (what the
        backend supports: gdn_cp.ops.backends.Backend.check; a mode may refuse more). Raised in the local
        checks, so that every rank raises together after the header."""
        backend.check(device=device, dtype=dtype, chunk_size=chunk_size, head_k_dim=head_k_dim, scale=scale)

    def layer_check(self, layer: GatedDeltaNet, x: torch.Tensor):
        """The local check of a layer call on x (for `plan_by_header`): the backend's."""
        c, backend = layer.config, self.backend(layer.config.backend)
        return lambda bounds: self.check_backend(backend, x.device, c.dtype, c.chunk_size, c.head_k_dim)

    def layer_signature(
        self, config: GatedDeltaNetConfig, x: torch.Tensor, final_state: bool = False
    ) -> CallSignature:
        """The signature of a layer call on x [B, L, hidden] (a prefill's with `final_state`)."""
        return self.signature(
            self.backend(config.backend),
            output_final_state=final_state,
            batch=x.shape[0],
            num_k_heads=config.num_k_heads,
            num_v_heads=config.num_v_heads,
            head_k_dim=config.head_k_dim,
            head_v_dim=config.head_v_dim,
            dtype=str(x.dtype).removeprefix("torch."),
            chunk_size=config.chunk_size,
            hidden_size=config.hidden_size,
            conv_kernel_size=config.conv_kernel_size,
        )

    def plan_by_header(
        self,
        signature: CallSignature,
        shard_len: int,
        cu_seqlens: torch.Tensor | None,
        device: torch.device,
        check=None,
    ) -> tuple[ShardPlan, list[int] | None]:
        """The shard plan every rank agrees on after the header all-gather (gdn_cp.distributed.header), and
        the checked global document boundaries (None unpacked); raises on every rank together."""
        local = check_local_input(signature, shard_len, cu_seqlens, check)
        plan = agree(local, self.rank, exchange_header(local.header(), self.group, device))
        return plan, plan_documents(plan, cu_seqlens)

    @abstractmethod
    def layer_shard(
        self, layer: GatedDeltaNet, x: torch.Tensor, cu_seqlens: torch.Tensor | None, final_state: bool
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """x [B, L, hidden] this rank's shard -> ([B, L, hidden], None), or with `final_state` this rank's
        shares of the final states: (conv [N, D, W], recurrent [N, Hv, K, V]), zeros where another rank
        holds the tokens (heads), so that the ranks' shares sum to the whole sequence's (`prefill`)."""

    def gated_delta_rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        *,
        scale: float | None = None,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        chunk_size: int = 64,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The GDN over the global sequence, on this rank's shard (shapes: gdn_cp.distributed.functional)."""
        backend = self.backend()

        def check(bounds: list[int] | None) -> None:
            check_gdn_inputs(q, k, v, g, beta)
            self.check_backend(backend, q.device, q.dtype, chunk_size, q.shape[3], scale)
            expected = (len(bounds) - 1 if bounds else q.shape[0], v.shape[2], k.shape[3], v.shape[3])
            if initial_state is not None and tuple(initial_state.shape) != expected:
                what = "[n, Hv, K, V] (one per document)" if bounds else "[B, Hv, K, V]"
                raise ValueError(
                    f"initial_state must be {what} = {list(expected)}, got {list(initial_state.shape)}; "
                    "every rank passes the same global initial state(s)"
                )

        signature = self.signature(
            backend,
            batch=q.shape[0],
            # a malformed q or v is `check`'s to name; its signature fields are then 0
            num_k_heads=q.shape[2] if q.dim() == 4 else 0,
            num_v_heads=v.shape[2] if v.dim() == 4 else 0,
            head_k_dim=q.shape[3] if q.dim() == 4 else 0,
            head_v_dim=v.shape[3] if v.dim() == 4 else 0,
            dtype=str(q.dtype).removeprefix("torch."),
            chunk_size=chunk_size,
            initial_state=initial_state is not None,
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            scale=0.0 if scale is None else float(scale),
        )
        with self.call_scope("op", q, chunk_size):
            plan, documents = self.plan_by_header(signature, q.shape[1], cu_seqlens, q.device, check)
            o, share = self.sharded_rule(
                plan,
                (q, k, v, g, beta),
                scale=scale,
                initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                documents=documents,
                chunk_size=chunk_size,
                backend=backend,
            )
        return (o, None) if share is None else sum_with_outputs(o, share, self.group)

    @abstractmethod
    def sharded_rule(
        self,
        plan: ShardPlan,
        inputs: tuple[torch.Tensor, ...],
        *,
        scale: float | None,
        initial_state: torch.Tensor | None,
        output_final_state: bool,
        use_qk_l2norm_in_kernel: bool,
        documents: list[int] | None,
        chunk_size: int,
        backend: Backend,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`gated_delta_rule` once every rank agrees on `plan`, but for the final states' sum: (o, this rank's
        share of the final states, [N, Hv, K, V] with zeros where another rank holds the tokens or heads, or
        None without output_final_state). Inputs (q, k, v, g, beta) are this rank's; `documents` the checked
        global boundaries (None: unpacked)."""
