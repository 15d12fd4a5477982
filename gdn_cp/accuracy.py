"""Accuracy of a CP layer against the full-sequence single-device reference (the reference PR's study).

Metrics per tensor (`error_stats`): max-abs error, the reference's abs-max, their ratio (scale-aware), the
relative L2 error and finiteness. The pass bars live here: `Thresholds` (the reference PR's, for the layer)
and `TrainThresholds` (for training trajectories); `LayerComparison.failures` names every metric above its
bar. `compare_layer_under_cp` runs on every rank of a process group, as `compare_prefill_under_cp` (the
serving prefill's output and final states).

Inputs (`INPUT_KINDS`): "random" is the reference PR's draw (the layer as it initialises itself, input and
output gradient ~ N(0, 1)); at that initialisation most value heads forget within a few tokens, and the state
entering a rank carries about 0.1% of its output: a state 1% off passes the PR's bf16 bars, and in training
a dropped one does.
"state" redraws each value head's decay (A_log, dt_bias: `state_inputs`) so that the state entering a piece
carries a share of its output that a check can see; `state_share` measures that share per rank (the
reference's GDN output with the entering states zeroed, as relative L2), and every comparison records it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from gdn_cp.distributed.collectives import all_reduce_gradients, group_rank_size
from gdn_cp.distributed.context_parallel import LinearAttentionContextParallel
from gdn_cp.distributed.layout import piece_owners
from gdn_cp.distributed.modes import CPOptions
from gdn_cp.distributed.sharding import gather_sequence, shard_sequence
from gdn_cp.dtypes import matmul_precision
from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig, seeded_layer
from gdn_cp.ops import causal_conv1d


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
    output_rel_l2: float | None = None
    """The output's relative L2 on its own (None: `rel_l2`). In bf16 the CP output agrees with the
    reference far better than the gradients do (cpu-verify's "state" inputs: 1e-4 against 4e-3), and a
    state 1% off shows there alone."""
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


INPUT_KINDS: tuple[str, ...] = ("random", "state")
"""How a comparison draws its inputs (module docstring): the reference PR's, or with states that matter."""
STATE_DECAY = (0.5, 0.95)
""""state" inputs: each value head's decay over one piece of the sequence (exp of its log-decays summed over
the piece's tokens, at the projection's mean) is drawn uniformly from this range: a state that is neither
forgotten within the piece nor left unchanged by it."""
STATE_RATE_SPREAD = (0.5, 2.0)
""""state" inputs: exp(A_log) is drawn log-uniformly from this range, dt_bias then sets the decay."""


def state_inputs(layer: GatedDeltaNet, piece_len: int, generator: torch.Generator) -> None:
    """Redraw `layer`'s A_log and dt_bias [Hv] in place (from `generator`, on the CPU) so that every value
    head's decay over `piece_len` tokens lies in STATE_DECAY: g = -exp(A_log) softplus(a + dt_bias) per token,
    so with rate = -log(decay) / piece_len, dt_bias = softplus^-1(rate / exp(A_log)) (for a = 0)."""
    heads = layer.A_log.shape[0]
    lo, hi = STATE_DECAY
    decay = lo + (hi - lo) * torch.rand(heads, generator=generator, dtype=torch.float64)
    spread = torch.tensor(STATE_RATE_SPREAD, dtype=torch.float64).log()
    a_log = spread[0] + (spread[1] - spread[0]) * torch.rand(heads, generator=generator, dtype=torch.float64)
    rate = -decay.log() / piece_len
    dt_bias = torch.expm1(rate / a_log.exp()).log()
    with torch.no_grad():
        layer.A_log.copy_(a_log)
        layer.dt_bias.copy_(dt_bias)


def _piece_bounds(seq_len: int, cp: int, layout: str) -> list[tuple[int, int, int]]:
    """(start, end, rank) of every piece of an even split of `seq_len` tokens over `cp` ranks in `layout`
    (shard_sequence's cut), in global order."""
    owners = piece_owners(layout, cp)
    edges = [round(i * seq_len / len(owners)) for i in range(len(owners) + 1)]
    return [(edges[j], edges[j + 1], owner) for j, owner in enumerate(owners)]


def edge_documents(seq_len: int, cp: int, layout: str) -> list[int]:
    """Boundaries [0, ..., seq_len] of documents that cross every rank edge of an even split over `cp` ranks
    in `layout`: one boundary in the middle of every piece after the first, so each document runs from one
    piece's middle into the next, carrying its state over the edge, and every rank holding such a piece has
    a boundary of its own (to move)."""
    pieces = _piece_bounds(seq_len, cp, layout)
    return [0, *((start + end) // 2 for start, end, _ in pieces[1:]), seq_len]


@torch.no_grad()
def state_share(
    layer: GatedDeltaNet, x: torch.Tensor, cp: int, layout: str, documents: Sequence[int] | None = None
) -> list[float]:
    """Per rank of an even split of x [B, T, hidden] over `cp` ranks in `layout`: how much of its GDN output
    o [B, T, Hv, V] (the core's, before norm and gate) the state entering its pieces carries, as
    ||o - o without it|| / ||o|| over the rank's tokens. "Without it": every piece run from a zero state
    (the Conv1D keeps its window; `documents` still cut both). Rank 0's share is 0 (its first piece starts the
    sequence) unless a later piece is its own (zigzag)."""
    p = layer.project(x)
    q, k, v = layer.split_qkv(causal_conv1d(p.mixed_qkv, layer.conv1d.weight, cu_seqlens=documents))
    o, _ = layer.core(q, k, v, p.a, p.b, cu_seqlens=documents)
    pieces = _piece_bounds(x.shape[1], cp, layout)
    cut = []
    for start, end, _ in pieces:
        inside = None
        if documents is not None:
            inside = [start] + [b for b in documents if start < b < end] + [end]
            inside = [b - start for b in inside]
        sl = slice(start, end)
        cut.append(layer.core(q[:, sl], k[:, sl], v[:, sl], p.a[:, sl], p.b[:, sl], cu_seqlens=inside)[0])
    o_cut = torch.cat(cut, dim=1)
    shares = []
    for rank in range(cp):
        mine = [slice(a, b) for a, b, owner in pieces if owner == rank]
        full = torch.cat([o[:, s] for s in mine], dim=1).double()
        diff = full - torch.cat([o_cut[:, s] for s in mine], dim=1).double()
        shares.append(diff.norm().item() / max(full.norm().item(), torch.finfo(torch.float64).tiny))
    return shares


@dataclass(kw_only=True, slots=True)
class TrainThresholds:
    """Pass bars of a training trajectory: the model under CP against the single-device reference over the
    same optimizer steps (`bench verify --train`). The reference PR reported its 100-step trajectory without
    bars; these are ours."""

    loss_rel: float = 1e-3
    """Max over steps of |loss_cp - loss_ref| / |loss_ref|. The PR's CP8 bf16 run peaked at 3.6e-5."""
    grad_norm_rel: float = 1e-2
    """Max over steps of the global gradient norm's relative difference (the layer's bar)."""
    first_loss_rel: float = 1e-3
    """The first step on "state" inputs (identical weights, no optimizer step yet): |loss_cp - loss_ref| /
    |loss_ref|. Per dtype, as the layer's bars (a scenario's `train_first_loss_rel`)."""
    first_grad_norm_rel: float = 1e-2
    """The first step's global gradient norm, relative difference."""
    first_gdn_output_rel_l2: float = 5e-2
    """The first step's first GDN layer output (the one nearest the input): relative L2, as the layer's
    output bar (its default, `Thresholds.rel_l2`)."""

    def __post_init__(self) -> None:
        _check_positive(self, "thresholds.train_")


def _check_positive(bars: Thresholds | TrainThresholds, prefix: str) -> None:
    for name, value in asdict(bars).items():
        if value is None and name == "output_rel_l2":  # unset: rel_l2 applies
            continue
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
    state_share: list[float] = field(default_factory=list)
    """Per rank: the share of its GDN output the entering state carries (`state_share`, on the reference);
    empty in files before it was measured."""

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

        output_rel_l2 = t.rel_l2 if t.output_rel_l2 is None else t.output_rel_l2
        for label, s, max_abs_bar, rel_l2_bar in (
            ("output", self.output, t.output_max_abs, output_rel_l2),
            ("input_grad", self.input_grad, t.input_grad_max_abs, t.rel_l2),
        ):
            if not s.finite:
                out.append(f"{label} has non-finite values")
            over(f"{label}.max_abs", s.max_abs, max_abs_bar)
            over(f"{label}.rel_max", s.rel_max, t.rel_max)
            over(f"{label}.rel_l2", s.rel_l2, rel_l2_bar)
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
    options: CPOptions | None = None,
    /,
    *,
    seq_len: int,
    batch: int = 1,
    seed: int = 0,
    group: ProcessGroup | None = None,
    device: torch.device | str = "cpu",
    layer_hook=None,
    documents: Sequence[int] | None = None,
    precision: str = "fp32",
    inputs: str = "random",
    **fields: Any,
) -> LayerComparison:
    """Run on every rank of `group`: the CP layer vs the full-sequence reference with identical weights.

    Every rank builds the same weights, input [batch, seq_len, hidden] and output gradient from `seed`; the
    CP layer runs forward and backward on its shard (cut in the options' layout), parameter gradients are
    summed over the group, and outputs and input gradients are gathered. Rank 0 runs the reference on the
    full sequence and computes the metrics, which every rank returns.

    Args:
        options: the CP layer's gdn_cp.distributed.CPOptions, given whole or by its fields (mode="p2p", ...);
            its backend None runs the config's, the reference always runs on the config's
        layer_hook: optional callable applied to the CP layer after `apply` (tests use it to break a mode)
        documents: global document boundaries [0, ..., seq_len] of a packed batch (batch 1): the CP layer
            gets them as cu_seqlens, and the reference runs every document on its own, as if alone (so the
            comparison also proves that nothing crosses a boundary)
        precision: how the CP layer's fp32 matmuls run (gdn_cp.dtypes.Precision: tf32 on a device's matrix
            units); the reference always runs in full fp32, so the comparison holds that precision to the
            bars
        inputs: how weights and inputs are drawn (INPUT_KINDS: "random", the reference PR's, or "state",
            whose entering states matter: `state_inputs` over the split's pieces)
    """
    options = CPOptions.build(options, **fields)
    layout = options.layout
    if inputs not in INPUT_KINDS:
        raise ValueError(f"inputs={inputs!r}: use one of {', '.join(INPUT_KINDS)}")
    rank, cp = group_rank_size(group)
    ref, cp_layer, x, grad_out = _seeded_setup(config, seed, batch, seq_len, device, inputs, cp, layout)
    LinearAttentionContextParallel(options).apply(cp_layer, group)
    if layer_hook is not None:
        layer_hook(cp_layer)
    y_cp, gx_cp = _run_cp_layer(cp_layer, x, grad_out, group, layout, documents, precision, device)

    result: list[LayerComparison | None] = [None]
    if rank == 0:  # the reference in full fp32 whatever `precision` (matmul_precision restored the flags)
        result[0] = _compare_with_reference(ref, cp_layer, x, grad_out, documents, y_cp, gx_cp)
        result[0].state_share = state_share(ref, x, cp, layout, documents)
    if dist.get_world_size(group) > 1:
        dist.broadcast_object_list(result, group_src=0, group=group)
    assert result[0] is not None
    return result[0]


def _seeded_setup(
    config: GatedDeltaNetConfig,
    seed: int,
    batch: int,
    seq_len: int,
    device: torch.device | str,
    inputs: str,
    cp: int,
    layout: str,
) -> tuple[GatedDeltaNet, GatedDeltaNet, torch.Tensor, torch.Tensor]:
    """(reference layer, its copy for CP, input x, output gradient), both [batch, seq_len, hidden]."""
    gen = torch.Generator().manual_seed(seed)
    ref = seeded_layer(config, seed, device)  # drawn on the CPU: the same weights on any device
    # x first, then grad_out: one generator draws both, so the order fixes their values
    x = torch.randn(batch, seq_len, config.hidden_size, generator=gen).to(device, config.dtype)
    grad_out = torch.randn(batch, seq_len, config.hidden_size, generator=gen).to(device, config.dtype)
    if inputs == "state":  # the same layer and inputs as "random" for the seed, but for the decays
        state_inputs(ref, seq_len // len(piece_owners(layout, cp)), gen)
    return ref, copy.deepcopy(ref), x, grad_out


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
    options: CPOptions | None = None,
    /,
    *,
    seq_len: int,
    batch: int = 1,
    seed: int = 0,
    group: ProcessGroup | None = None,
    device: torch.device | str = "cpu",
    documents: Sequence[int] | None = None,
    **fields: Any,
) -> PrefillComparison:
    """Run on every rank of `group`: the CP prefill (under torch.inference_mode) against the single-device
    prefill of the whole sequence, with identical weights and input (drawn from `seed`, as
    `compare_layer_under_cp`, the options likewise). Rank 0 runs the reference and computes the metrics,
    which every rank returns; each rank's states are its own (every rank must hold the whole sequence's:
    rank 0's are compared)."""
    options = CPOptions.build(options, **fields)
    layout = options.layout
    rank, _ = group_rank_size(group)
    gen = torch.Generator().manual_seed(seed)
    ref = seeded_layer(config, seed, device)
    cp_layer = LinearAttentionContextParallel(options).apply(copy.deepcopy(ref), group)
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
