"""Accuracy of a CP layer against the full-sequence single-device reference (the reference PR's study).

Metrics per tensor (`error_stats`): max-abs error, the reference's abs-max, their ratio (scale-aware), the
relative L2 error and finiteness. The pass bars live here: `Thresholds` (the reference PR's, for the layer)
and `TrainThresholds` (for training trajectories); `LayerComparison.failures` names every metric above its
bar. `compare_layer_under_cp` runs on every rank of a process group, as `compare_prefill_under_cp` (the
serving prefill's output and final states).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from gdn_cp.distributed.collectives import all_reduce_gradients, group_rank_size
from gdn_cp.distributed.context_parallel import LinearAttentionContextParallel
from gdn_cp.distributed.layout import DEFAULT_LAYOUT
from gdn_cp.distributed.sharding import gather_sequence, shard_sequence
from gdn_cp.dtypes import matmul_precision
from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig, seeded_layer


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """Error of one tensor against its reference (computed in fp64)."""

    max_abs: float
    """max |actual - reference|"""
    ref_absmax: float
    """max |reference|"""
    ref_l2: float
    """||reference||: with ref_absmax, the scale a relative error is taken against"""
    rel_max: float
    """max_abs / ref_absmax: the error on the reference's own scale"""
    rel_l2: float
    """||actual - reference|| / ||reference||"""
    finite: bool
    """every element of actual is finite"""


def error_stats(actual: torch.Tensor, reference: torch.Tensor) -> ErrorStats:
    # in fp64 on the host: devices without fp64 (Ascend) compute it there, and one reduction syncs once
    a, r = (t.detach().to("cpu", torch.float64) for t in (actual, reference))
    diff = a - r
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    ref_absmax = r.abs().max().item() if r.numel() else 0.0
    ref_norm = r.norm().item()
    tiny = torch.finfo(torch.float64).tiny
    return ErrorStats(
        max_abs=max_abs,
        ref_absmax=ref_absmax,
        ref_l2=ref_norm,
        rel_max=max_abs / max(ref_absmax, tiny),
        rel_l2=diff.norm().item() / max(ref_norm, tiny),
        finite=bool(torch.isfinite(a).all()),
    )


@dataclass(kw_only=True, slots=True)
class Thresholds:
    """Pass bars. Defaults are the reference PR's bf16 bars (reference PR, section 1)."""

    output_max_abs: float = 5e-2
    """Output max-abs error (an outlier guard; the scale-aware bars below decide)."""
    input_grad_max_abs: float = 5e-1
    """Input-gradient max-abs error."""
    rel_max: float = 1e-1
    """Output and input gradient: max_abs / ref_absmax."""
    rel_l2: float = 5e-2
    """Output and input gradient: relative L2."""
    param_rel_max: float = 1e-1
    """Every parameter gradient: max_abs / ref_absmax."""
    param_rel_l2: float = 1e-1
    """Every parameter gradient: relative L2."""
    grad_norm_rel: float = 1e-2
    """Global gradient norm: relative difference."""

    def __post_init__(self) -> None:
        _check_positive(self, "thresholds.")

    @classmethod
    def tight(cls, tol: float) -> Thresholds:
        """Every bar at `tol` (fp32 / fp64 exactness checks)."""
        return cls(**{name: tol for name in cls.__dataclass_fields__})


@dataclass(kw_only=True, slots=True)
class TrainThresholds:
    """Pass bars of a training trajectory: the model under CP against the single-device reference over the
    same optimizer steps (`bench verify --train`). The reference PR reported its 100-step trajectory without
    bars; these are ours."""

    loss_rel: float = 1e-3
    """Max over steps of |loss_cp - loss_ref| / |loss_ref|. The PR's CP8 bf16 run peaked at 3.6e-5."""
    grad_norm_rel: float = 1e-2
    """Max over steps of the global gradient norm's relative difference (the layer's bar)."""

    def __post_init__(self) -> None:
        _check_positive(self, "thresholds.train_")


def _check_positive(bars: Thresholds | TrainThresholds, prefix: str) -> None:
    for name, value in asdict(bars).items():
        if isinstance(value, bool) or not (isinstance(value, int | float) and value > 0):
            raise ValueError(f"{prefix}{name} must be a positive number, got {value!r}")


@dataclass(slots=True)
class LayerComparison:
    """A CP layer's output and gradients against the reference layer's."""

    output: ErrorStats
    input_grad: ErrorStats
    params: dict[str, ErrorStats]
    """Per parameter gradient, by name; a missing gradient is recorded in `missing_grads`."""
    grad_norm_ref: float
    grad_norm_cp: float
    missing_grads: list[str] = field(default_factory=list)

    @property
    def grad_norm_rel(self) -> float:
        return abs(self.grad_norm_cp - self.grad_norm_ref) / max(self.grad_norm_ref, 1e-300)

    @property
    def worst_param(self) -> tuple[str, ErrorStats]:
        """The parameter gradient with the largest relative L2 error."""
        return max(self.params.items(), key=lambda kv: kv[1].rel_l2)

    def failures(self, t: Thresholds) -> list[str]:
        """Every metric above its bar, as 'metric value > bar' strings (empty: the comparison passes)."""
        out: list[str] = []

        def over(name: str, value: float, bar: float) -> None:
            if not value <= bar:  # NaN fails too
                out.append(f"{name} {value:.3e} > {bar:.1e}")

        for label, s, max_abs_bar in (
            ("output", self.output, t.output_max_abs),
            ("input_grad", self.input_grad, t.input_grad_max_abs),
        ):
            if not s.finite:
                out.append(f"{label} has non-finite values")
            over(f"{label}.max_abs", s.max_abs, max_abs_bar)
            over(f"{label}.rel_max", s.rel_max, t.rel_max)
            over(f"{label}.rel_l2", s.rel_l2, t.rel_l2)
        out.extend(f"param {name}: gradient missing" for name in self.missing_grads)
        for name, s in self.params.items():
            if not s.finite:
                out.append(f"param {name}: gradient has non-finite values")
            over(f"param {name}.rel_max", s.rel_max, t.param_rel_max)
            over(f"param {name}.rel_l2", s.rel_l2, t.param_rel_l2)
        over("grad_norm_rel", self.grad_norm_rel, t.grad_norm_rel)
        return out


def _grad_norm(module: torch.nn.Module) -> float:
    return math.sqrt(
        sum(
            p.grad.detach().to("cpu", torch.float64).pow(2).sum().item()
            for p in module.parameters()
            if p.grad is not None
        )
    )


def compare_layer_under_cp(
    config: GatedDeltaNetConfig,
    *,
    mode: str,
    checkpoint_summary: bool = True,
    seq_len: int,
    batch: int = 1,
    seed: int = 0,
    group: ProcessGroup | None = None,
    device: torch.device | str = "cpu",
    layer_hook=None,
    layout: str = DEFAULT_LAYOUT,
    documents: Sequence[int] | None = None,
    overlap: bool = False,
    precision: str = "fp32",
    backend: str | None = None,
) -> LayerComparison:
    """Run on every rank of `group`: the CP layer vs the full-sequence reference with identical weights.

    Every rank builds the same weights, input [batch, seq_len, hidden] and output gradient from `seed`; the
    CP layer runs forward and backward on its shard (cut in `layout`), parameter gradients are summed over
    the group, and outputs and input gradients are gathered. Rank 0 runs the reference on the full sequence
    and computes the metrics, which every rank returns.

    Args:
        layer_hook: optional callable applied to the CP layer after `apply` (tests use it to break a mode)
        layout: how the sequence is cut over the ranks (gdn_cp.distributed.LAYOUTS)
        documents: global document boundaries [0, ..., seq_len] of a packed batch (batch 1): the CP layer
            gets them as cu_seqlens, and the reference runs every document on its own, as if alone (so the
            comparison also proves that nothing crosses a boundary)
        overlap: the CP layer's LinearAttentionContextParallel.overlap
        backend: the CP layer's local op (LinearAttentionContextParallel.backend; None: the config's); the
            reference runs on the config's
        precision: how the CP layer's fp32 matmuls run (gdn_cp.dtypes.Precision: tf32 on a device's matrix
            units); the reference always runs in full fp32, so the comparison holds that precision to the
            bars
    """
    rank, _ = group_rank_size(group)
    ref, cp_layer, x, grad_out = _seeded_setup(config, seed, batch, seq_len, device)
    LinearAttentionContextParallel(
        mode=mode, checkpoint_summary=checkpoint_summary, layout=layout, overlap=overlap, backend=backend
    ).apply(cp_layer, group)
    if layer_hook is not None:
        layer_hook(cp_layer)
    y_cp, gx_cp = _run_cp_layer(cp_layer, x, grad_out, group, layout, documents, precision, device)

    result: list[LayerComparison | None] = [None]
    if rank == 0:  # the reference in full fp32 whatever `precision` (matmul_precision restored the flags)
        result[0] = _compare_with_reference(ref, cp_layer, x, grad_out, documents, y_cp, gx_cp)
    if dist.get_world_size(group) > 1:
        dist.broadcast_object_list(result, group_src=0, group=group)
    assert result[0] is not None
    return result[0]


def _seeded_setup(
    config: GatedDeltaNetConfig, seed: int, batch: int, seq_len: int, device: torch.device | str
) -> tuple[GatedDeltaNet, GatedDeltaNet, torch.Tensor, torch.Tensor]:
    """(reference layer, its copy for CP, input x, output gradient), both [batch, seq_len, hidden]."""
    gen = torch.Generator().manual_seed(seed)
    ref = seeded_layer(config, seed, device)  # drawn on the CPU: the same weights on any device
    cp_layer = copy.deepcopy(ref)
    # x first, then grad_out: one generator draws both, so the order fixes their values
    x = torch.randn(batch, seq_len, config.hidden_size, generator=gen).to(device, config.dtype)
    grad_out = torch.randn(batch, seq_len, config.hidden_size, generator=gen).to(device, config.dtype)
    return ref, cp_layer, x, grad_out


def _run_cp_layer(
    cp_layer: GatedDeltaNet,
    x: torch.Tensor,
    grad_out: torch.Tensor,
    group: ProcessGroup | None,
    layout: str,
    documents: Sequence[int] | None,
    precision: str,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, input gradient) [batch, seq_len, hidden] of the CP layer, gathered; param grads summed."""
    cu_seqlens = None if documents is None else torch.tensor(list(documents), device=device)
    x_local = shard_sequence(x, group, layout=layout).clone().requires_grad_(True)
    with matmul_precision(precision, torch.device(device).type):
        y_local = cp_layer(x_local, cu_seqlens=cu_seqlens)
        y_local.backward(shard_sequence(grad_out, group, layout=layout))
    all_reduce_gradients(cp_layer.parameters(), group)
    y_cp = gather_sequence(y_local.detach(), group, layout=layout)
    gx_cp = gather_sequence(x_local.grad, group, layout=layout)
    return y_cp, gx_cp


def _compare_with_reference(
    ref: GatedDeltaNet,
    cp_layer: GatedDeltaNet,
    x: torch.Tensor,
    grad_out: torch.Tensor,
    documents: Sequence[int] | None,
    y_cp: torch.Tensor,
    gx_cp: torch.Tensor,
) -> LayerComparison:
    """The CP layer's output [batch, seq_len, hidden] and gradients against the reference's on all of x."""
    x_ref = x.clone().requires_grad_(True)
    if documents is None:
        y_ref = ref(x_ref)
    else:
        y_ref = torch.cat([ref(x_ref[:, a:b]) for a, b in pairwise(documents)], dim=1)
    y_ref.backward(grad_out)
    ref_params = dict(ref.named_parameters())
    params, missing = {}, []
    for name, p in cp_layer.named_parameters():
        if p.grad is None:
            missing.append(name)
        else:
            params[name] = error_stats(p.grad, ref_params[name].grad)
    return LayerComparison(
        output=error_stats(y_cp, y_ref),
        input_grad=error_stats(gx_cp, x_ref.grad),
        params=params,
        grad_norm_ref=_grad_norm(ref),
        grad_norm_cp=_grad_norm(cp_layer),
        missing_grads=missing,
    )


@dataclass(frozen=True, slots=True)
class PrefillComparison:
    """A CP prefill's output and final states against the single-device prefill's (GatedDeltaNet.prefill)."""

    output: ErrorStats
    conv_state: ErrorStats
    recurrent_state: ErrorStats

    def worst_rel_l2(self) -> float:
        return max(self.output.rel_l2, self.conv_state.rel_l2, self.recurrent_state.rel_l2)


def compare_prefill_under_cp(
    config: GatedDeltaNetConfig,
    *,
    mode: str,
    seq_len: int,
    batch: int = 1,
    seed: int = 0,
    group: ProcessGroup | None = None,
    device: torch.device | str = "cpu",
    layout: str = DEFAULT_LAYOUT,
    documents: Sequence[int] | None = None,
) -> PrefillComparison:
    """Run on every rank of `group`: the CP prefill (under torch.inference_mode) against the single-device
    prefill of the whole sequence, with identical weights and input (drawn from `seed`, as
    `compare_layer_under_cp`). Rank 0 runs the reference and computes the metrics, which every rank returns;
    each rank's states are its own (every rank must hold the whole sequence's: rank 0's are compared)."""
    rank, _ = group_rank_size(group)
    gen = torch.Generator().manual_seed(seed)
    ref = seeded_layer(config, seed, device)
    cp_layer = LinearAttentionContextParallel(mode=mode, layout=layout).apply(copy.deepcopy(ref), group)
    x = torch.randn(batch, seq_len, config.hidden_size, generator=gen).to(device, config.dtype)
    cu_seqlens = None if documents is None else torch.tensor(list(documents), device=device)
    with torch.inference_mode():
        y_local, state = cp_layer.prefill(shard_sequence(x, group, layout=layout), cu_seqlens=cu_seqlens)
        y_cp = gather_sequence(y_local, group, layout=layout)
        result: list[PrefillComparison | None] = [None]
        if rank == 0:
            y_ref, state_ref = ref.prefill(x, cu_seqlens=cu_seqlens)
            result[0] = PrefillComparison(
                output=error_stats(y_cp, y_ref),
                conv_state=error_stats(state.conv_state, state_ref.conv_state),
                recurrent_state=error_stats(state.recurrent_state, state_ref.recurrent_state),
            )
    if dist.get_world_size(group) > 1:
        dist.broadcast_object_list(result, group_src=0, group=group)
    assert result[0] is not None
    return result[0]
