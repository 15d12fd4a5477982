"""What every rank of `bench verify --train` runs: the reference PR's trajectory study (section 2).

The hybrid model (gdn_cp.models.Qwen35Hybrid, 3 linear : 1 full attention by default) is built from one seed
on every rank; rank 0 keeps a copy as the single-rank reference, which runs on the full sequence. The CP
model is put under context parallelism over all ranks of the launch (GDN layers in the case's mode, full
attention by Ulysses), and its parameter gradients are summed over the ranks:

- fsdp2: `torch.distributed.fsdp.fully_shard` on every decoder layer and the root, over a 1-D DeviceMesh of
  the CP ranks. The model's loss on a rank is its share of the global mean, so the partial gradients must be
  SUMMED; FSDP2 averages by default, so every FSDP module gets a gradient divide factor of 1
  (`set_gradient_divide_factor`, `set_reduce_scatter_divide_factor` before torch 2.7) and, where torch has
  it, `set_force_sum_reduction_for_comms(True)`: a plain SUM reduce-scatter (gloo has no PREMUL_SUM).
- all_reduce: gdn_cp.distributed.all_reduce_gradients after backward.

Precision (`train.master_weights`): with fp32 master weights and a bf16 (or fp16) scenario, both models keep
parameters, gradients and AdamW state in fp32 and run forward and backward in the scenario's dtype: under
FSDP2 through its MixedPrecisionPolicy (param_dtype = the scenario's dtype, reduce_dtype = fp32), otherwise
through `MixedPrecision`, which makes the same casts by hand (parameters cast down before each step,
gradients cast up before they are summed and stepped).

Before step 0 every parameter of the CP model (gathered to full size under FSDP2) is compared with the
reference's, bit for bit. Each step draws a new random batch (the same on every rank and for both models),
runs forward and backward, records the global loss and the global gradient norm of both models, then steps
AdamW on both.

The check with power (`_first_step`), before the trajectory: a second pair of models from the same seed
whose GDN layers draw "state" decays (gdn_cp.accuracy.state_inputs over the ranks' shards: the state
entering a rank carries a share of every GDN layer's output) takes one forward and backward on the first
batch, the reference on rank 0 and the CP model on all ranks (FirstStep: loss, gradient norm and the first GDN
layer's output). Then each mutant that applies to
the case (bench.verification.mutants: CP's on rank 1, and a backend's op's other than gdn_cp's) runs the CP
model's first step again on that model and on the trajectory's (TrainMutant), gradients cleared after each,
no optimizer step: what the first-step bars and the trajectory's bars can catch.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from bench.measure.gate import CaseCheckError, ran_problems
from bench.results.verifications import FirstStep, TrainMutant, Trajectory
from bench.suite.config import Case, TrainSettings
from bench.verification.mutants import case_mutants, mutated
from gdn_cp.accuracy import state_inputs
from gdn_cp.distributed import (
    Platform,
    all_reduce_gradients,
    gather_sequence,
    local_rank,
    resolve_platform,
    shard_sequence,
)
from gdn_cp.distributed.collectives import group_rank_size
from gdn_cp.layers import GatedDeltaNet
from gdn_cp.models import Qwen35Hybrid, Qwen35HybridConfig, apply_context_parallel
from gdn_cp.ops import ran

STATE_SEED_OFFSET = 2
"""The "state" decays of the first-step models draw from case.seed + this (batches draw from seed + 1)."""


def hybrid_config(case: Case, settings: TrainSettings) -> Qwen35HybridConfig:
    """The hybrid model of a case: the GDN layers from the case, the rest from the train settings; its
    parameters in fp32 with fp32 master weights, else in the case's dtype."""
    return Qwen35HybridConfig(
        vocab_size=settings.vocab_size,
        hidden_size=case.layer.hidden_size,
        intermediate_size=settings.intermediate_size,
        layer_types=tuple(settings.layer_types),
        num_attention_heads=settings.num_attention_heads,
        num_key_value_heads=settings.num_key_value_heads,
        head_dim=settings.head_dim,
        linear_num_key_heads=case.layer.num_k_heads,
        linear_num_value_heads=case.layer.num_v_heads,
        linear_key_head_dim=case.layer.head_k_dim,
        linear_value_head_dim=case.layer.head_v_dim,
        linear_conv_kernel_dim=case.layer.conv_kernel_size,
        chunk_size=case.layer.chunk_size,
        dtype="fp32" if settings.master_weights == "fp32" else case.dtype,
    )


def fsdp2_available() -> bool:
    """Whether this torch has FSDP2 (`torch.distributed.fsdp.fully_shard`)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_grad_reduction(setting: str) -> str:
    """auto -> fsdp2 where torch has it, else all_reduce; fsdp2 and all_reduce stay."""
    if setting != "auto":
        return setting
    return "fsdp2" if fsdp2_available() else "all_reduce"


class MixedPrecision:
    """fp32 master parameters with forward and backward in a lower dtype, by hand (what FSDP2's
    MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=fp32) does, without FSDP).

    `compute` is a copy of `master` in `compute_dtype`; `to_compute()` refreshes it from the master weights
    (before each step), `grads_to_master()` hands its gradients to the master parameters in fp32.
    """

    def __init__(self, master: nn.Module, compute_dtype: torch.dtype) -> None:
        self.master = master
        self.compute = copy.deepcopy(master)
        for p in self.compute.parameters():  # parameters only, as FSDP2: buffers (RoPE's) keep their dtype
            p.data = p.data.to(compute_dtype)

    def to_compute(self) -> None:
        with torch.no_grad():
            for c, m in zip(self.compute.parameters(), self.master.parameters(), strict=True):
                c.copy_(m)

    def grads_to_master(self) -> None:
        for c, m in zip(self.compute.parameters(), self.master.parameters(), strict=True):
            m.grad = None if c.grad is None else c.grad.to(m.dtype)
            c.grad = None


def shard_with_fsdp2(model: Qwen35Hybrid, mesh, compute_dtype: torch.dtype | None = None) -> None:
    """fully_shard every decoder layer and the root over `mesh`, with gradients summed (not averaged);
    with `compute_dtype`, forward and backward run in it and gradients are summed in fp32."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=compute_dtype, reduce_dtype=torch.float32 if compute_dtype else None
    )
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            divide = getattr(module, "set_gradient_divide_factor", None)
            (divide or module.set_reduce_scatter_divide_factor)(1.0)
            force_sum = getattr(module, "set_force_sum_reduction_for_comms", None)
            if force_sum is not None:
                force_sum(True)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2 parameters and gradients), else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _full(p: torch.Tensor) -> torch.Tensor:
    """The full tensor of a (possibly FSDP2-sharded) parameter; a collective under FSDP2."""
    full_tensor = getattr(p, "full_tensor", None)
    return (full_tensor() if full_tensor is not None else p).detach()


def _norm_dtype(device: torch.device) -> torch.dtype:
    """fp64 for gradient norms where the device has it (cpu, cuda); npu sums squares in fp32."""
    return torch.float32 if device.type == "npu" else torch.float64


def grad_norm(model: nn.Module, *, sharded: bool, group: ProcessGroup | None = None) -> float:
    """The global L2 norm of the gradients; `sharded`: each rank holds a shard, summed over the group."""
    device = next(model.parameters()).device
    total = torch.zeros((), dtype=_norm_dtype(device), device=device)
    for p in model.parameters():
        if p.grad is not None:
            total += _local(p.grad).to(total.dtype).pow(2).sum()
    if sharded:
        dist.all_reduce(total, group=group)
    return math.sqrt(total.item())


def _mismatched(model: nn.Module, reference: nn.Module | None) -> tuple[int, list[str]]:
    """(parameters compared, names not bit-identical): every rank gathers each parameter, rank 0 (holding
    `reference`) compares."""
    ref_params = dict(reference.named_parameters()) if reference is not None else {}
    checked, bad = 0, []
    for name, p in model.named_parameters():
        full = _full(p)
        checked += 1
        if reference is not None:
            ref = ref_params.get(name)
            if ref is None or ref.shape != full.shape or not torch.equal(full, ref.detach()):
                bad.append(name)
    if reference is not None:
        bad += sorted(set(ref_params) - {n for n, _ in model.named_parameters()})
    return checked, bad


def _cp_mesh(platform: Platform, group: ProcessGroup | None, cp: int) -> DeviceMesh:
    """The 1-D DeviceMesh "cp" of the case's ranks: over the default group (None) or over `group`."""
    if group is None:
        return init_device_mesh(platform.device_type, (cp,), mesh_dim_names=("cp",))
    return DeviceMesh.from_group(group, platform.device_type, mesh_dim_names=("cp",))


def _parallelize(
    model: Qwen35Hybrid,
    case: Case,
    platform: Platform,
    group: ProcessGroup | None,
    *,
    cp: int,
    reduction: str,
    cast_dtype: torch.dtype | None,
) -> MixedPrecision | None:
    """The hand-made casts of mixed precision (all_reduce with `cast_dtype`), else None; puts `model` under
    CP (and FSDP2) in place."""
    if reduction == "fsdp2":
        mesh = _cp_mesh(platform, group, cp)
        apply_context_parallel(model, mesh, case.options)
        shard_with_fsdp2(model, mesh, cast_dtype)
        return None
    # Without FSDP2 the casts of mixed precision are made by hand: the compute copy runs under CP,
    # the fp32 master weights only take its gradients and the optimizer's steps.
    cp_cast = MixedPrecision(model, cast_dtype) if cast_dtype is not None else None
    apply_context_parallel(cp_cast.compute if cp_cast else model, group, case.options)
    return cp_cast


def _adamw(model: nn.Module, settings: TrainSettings) -> torch.optim.Optimizer:
    """AdamW over `model`'s parameters at the settings' learning rate and weight decay."""
    return torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)


def _batch(
    generator: torch.Generator, vocab_size: int, case: Case, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), each [batch, seq_len] int64 on `device`: a new random batch, labels = next tokens."""
    tokens = torch.randint(0, vocab_size, (case.batch, case.seq_len + 1), generator=generator)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


@contextlib.contextmanager
def _first_gdn_output(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collects the output [B, L, hidden] (detached) of `model`'s first GDN layer, the one nearest the
    input, in the block: where CP's and the reference's inputs are still identical, so that their outputs
    differ by the CP layer alone (as in the layer check), not by rounding carried from earlier layers."""
    out: list[torch.Tensor] = []
    layer = next(m for m in model.modules() if isinstance(m, GatedDeltaNet))
    handle = layer.register_forward_hook(lambda module, args, output: out.append(output.detach()))
    try:
        yield out
    finally:
        handle.remove()


def _rel_l2(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """||actual - reference|| / ||reference||, in fp64 on the host."""
    a, r = (t.detach().to("cpu", torch.float64) for t in (actual, reference))
    return (a - r).norm().item() / max(r.norm().item(), torch.finfo(torch.float64).tiny)


def _cp_grads(
    model: Qwen35Hybrid,
    cp_cast: MixedPrecision | None,
    batch: tuple[torch.Tensor, torch.Tensor],
    *,
    reduction: str,
    group: ProcessGroup | None,
    capture: bool = False,
) -> tuple[float, float, torch.Tensor | None]:
    """(global loss, global gradient norm, with `capture` the first GDN layer's output [B, T, hidden]
    gathered, else None) of the CP model's forward and backward on this rank's shards of `batch`; the summed
    gradients are left on `model`'s parameters."""
    inputs, labels = batch
    shards = shard_sequence(inputs, group), shard_sequence(labels, group)
    running = cp_cast.compute if cp_cast else model
    with _first_gdn_output(running) if capture else contextlib.nullcontext([]) as captured:
        result = running(*shards)
    assert result.loss is not None
    result.loss.backward()
    if cp_cast is not None:
        cp_cast.grads_to_master()
    if reduction == "all_reduce":
        all_reduce_gradients(model.parameters(), group)
    loss = result.loss.detach().float().clone()
    dist.all_reduce(loss, group=group)  # the ranks' shares sum to the global mean
    output = gather_sequence(captured[0], group) if capture else None
    return loss.item(), grad_norm(model, sharded=reduction == "fsdp2", group=group), output


def _cp_step(
    model: Qwen35Hybrid,
    cp_cast: MixedPrecision | None,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    *,
    reduction: str,
    group: ProcessGroup | None,
) -> tuple[float, float]:
    """(global loss, global gradient norm) of one step of the CP model on this rank's shards of `batch`,
    then its AdamW step."""
    loss_value, norm, _ = _cp_grads(model, cp_cast, batch, reduction=reduction, group=group)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if cp_cast is not None:
        cp_cast.to_compute()
    return loss_value, norm


def _floor_twin(
    reference: Qwen35Hybrid | None,
    config: Qwen35HybridConfig,
    compute_dtype: torch.dtype | None,
    settings: TrainSettings,
) -> tuple[Qwen35Hybrid, MixedPrecision | None, torch.optim.Optimizer] | None:
    """On the reference's rank, a second single-rank reference (its model, cast and optimizer): the same
    weights at another chunk size, the same math in another rounding order, whose distance from the
    reference is the dtype's own spread (TrainVerification.bar). None on the other ranks."""
    if reference is None:
        return None
    chunk = config.chunk_size // 2 if config.chunk_size >= 32 else config.chunk_size * 2
    # its initialisers draw from the global RNG on this rank alone: forked, so that every rank's stream
    # stays as it was (the weights come from the reference anyway)
    with torch.random.fork_rng(devices=[]):
        twin = Qwen35Hybrid(dataclasses.replace(config, chunk_size=chunk))
    twin = twin.to(next(reference.parameters()).device)
    twin.load_state_dict(reference.state_dict())
    cast = MixedPrecision(twin, compute_dtype) if compute_dtype is not None else None
    return twin, cast, _adamw(twin, settings)


def _reference_grads(
    reference: Qwen35Hybrid, ref_cast: MixedPrecision | None, batch: tuple[torch.Tensor, torch.Tensor]
) -> tuple[float, float, torch.Tensor]:
    """(loss, gradient norm, the first GDN layer's output [B, T, hidden]) of the single-rank reference's
    forward and backward on the full `batch`; the gradients are left on `reference`'s parameters."""
    running = ref_cast.compute if ref_cast else reference
    with _first_gdn_output(running) as captured:
        ref_result = running(*batch)
    assert ref_result.loss is not None
    ref_result.loss.backward()
    if ref_cast is not None:
        ref_cast.grads_to_master()
    return ref_result.loss.detach().float().item(), grad_norm(reference, sharded=False), captured[0]


def _reference_step(
    reference: Qwen35Hybrid,
    ref_cast: MixedPrecision | None,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
) -> tuple[float, float]:
    """(loss, gradient norm) of one step of the single-rank reference on the full `batch`, then its AdamW
    step."""
    loss, norm, _ = _reference_grads(reference, ref_cast, batch)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if ref_cast is not None:
        ref_cast.to_compute()
    return loss, norm


def _mutant_grads(
    case: Case,
    names: list[str],
    model: Qwen35Hybrid,
    cp_cast: MixedPrecision | None,
    batch: tuple[torch.Tensor, torch.Tensor],
    *,
    reduction: str,
    group: ProcessGroup | None,
    capture: bool = False,
) -> list[tuple[float, float, torch.Tensor | None]]:
    """Per mutant of `names`: `_cp_grads` of the CP model on `batch` with it on; gradients cleared after."""
    out = []
    for name in names:
        with mutated(case, name):
            out.append(_cp_grads(model, cp_cast, batch, reduction=reduction, group=group, capture=capture))
        model.zero_grad(set_to_none=True)
    return out


def _build(
    case: Case,
    config: Qwen35HybridConfig,
    device: torch.device,
    rank: int,
    cp: int,
    *,
    state: bool,
) -> tuple[Qwen35Hybrid, Qwen35Hybrid | None]:
    """(the model every rank builds from the case's seed, rank 0's copy as the reference, else None); with
    `state`, every GDN layer's decays redrawn as "state" inputs over the ranks' contiguous shards."""
    torch.manual_seed(case.seed)  # module initialisers draw from the global RNG: the same weights everywhere
    model = Qwen35Hybrid(config)
    if state:
        generator = torch.Generator().manual_seed(case.seed + STATE_SEED_OFFSET)
        for layer in model.modules():
            if isinstance(layer, GatedDeltaNet):
                state_inputs(layer, case.seq_len // cp, generator)
    model = model.to(device)
    return model, (copy.deepcopy(model) if rank == 0 else None)


def _first_step(
    case: Case,
    config: Qwen35HybridConfig,
    platform: Platform,
    group: ProcessGroup | None,
    batch: tuple[torch.Tensor, torch.Tensor],
    names: list[str],
    *,
    reduction: str,
    cast_dtype: torch.dtype | None,
) -> tuple[FirstStep, list[tuple[float, float, float]]]:
    """The first step on the "state" models (module docstring): FirstStep (the reference's numbers and the
    first GDN layer's error are rank 0's, shared after), and per mutant of `names` the CP model's (loss, grad
    norm, its first GDN layer's output rel-L2 against the reference's on rank 0) with it on."""
    rank, cp = group_rank_size(group)
    model, reference = _build(case, config, platform.device(local_rank()), rank, cp, state=True)
    cp_cast = _parallelize(model, case, platform, group, cp=cp, reduction=reduction, cast_dtype=cast_dtype)
    ref: tuple[float, float, torch.Tensor | None] = (0.0, 0.0, None)
    if reference is not None:
        ref_cast = MixedPrecision(reference, cast_dtype) if cast_dtype is not None else None
        ref = _reference_grads(reference, ref_cast, batch)
    runs = [_cp_grads(model, cp_cast, batch, reduction=reduction, group=group, capture=True)]
    model.zero_grad(set_to_none=True)
    runs += _mutant_grads(case, names, model, cp_cast, batch, reduction=reduction, group=group, capture=True)
    ref_output = ref[2]
    rel = [0.0 if ref_output is None or o is None else _rel_l2(o, ref_output) for _, _, o in runs]
    (loss, norm, _), broken = runs[0], runs[1:]
    first = FirstStep(
        ref_loss=ref[0], cp_loss=loss, ref_grad_norm=ref[1], cp_grad_norm=norm, gdn_output_rel_l2=rel[0]
    )
    return first, [(m[0], m[1], r) for m, r in zip(broken, rel[1:], strict=True)]


def train_on_rank(
    case: Case,
    device_kind: str,
    *,
    settings: TrainSettings,
    steps: int,
    group: ProcessGroup | None = None,
) -> Trajectory:
    """Train the reference (rank 0) and the CP model (all ranks) for `steps` steps; see the module docstring.

    Args:
        case: mode, checkpoint, cp (the group's size), seq_len, batch, dtype, seed and the GDN dims
        device_kind: the launch's device (cpu, cuda, npu)
        settings: the model and optimizer (bench.suite.config.TrainSettings)
        steps: optimizer steps
        group: the case's process group (None: the default group, a launch of cp ranks; a torchrun job
            gives each case a group of its own over global ranks 0 .. cp - 1, global rank 0 its rank 0)
    Returns:
        The per-step losses and gradient norms of both models, identical on every rank.
    """
    platform = resolve_platform(device_kind)
    device = platform.device(local_rank())
    rank, cp = group_rank_size(group)
    config = hybrid_config(case, settings)
    compute_dtype = case.layer.dtype
    mixed = config.dtype != compute_dtype  # fp32 master weights, a lower compute dtype
    reduction = resolve_grad_reduction(settings.grad_reduction)
    cast_dtype = compute_dtype if mixed else None
    generator = torch.Generator().manual_seed(case.seed + 1)  # drawn on the cpu: the same batches everywhere
    first_batch = _batch(generator, config.vocab_size, case, device)
    names = case_mutants(case, cp, False)
    first, first_broken = _first_step(
        case, config, platform, group, first_batch, names, reduction=reduction, cast_dtype=cast_dtype
    )

    model, reference = _build(case, config, device, rank, cp, state=False)
    cp_cast = _parallelize(model, case, platform, group, cp=cp, reduction=reduction, cast_dtype=cast_dtype)
    checked, mismatched = _mismatched(model, reference)
    ref_cast = MixedPrecision(reference, compute_dtype) if mixed and reference is not None else None
    optimizer = _adamw(model, settings)
    ref_optimizer = _adamw(reference, settings) if reference is not None else None
    floor = _floor_twin(reference, config, compute_dtype if mixed else None, settings)
    out = Trajectory(grad_reduction=reduction, params_checked=checked, mismatched_params=mismatched)
    out.first = first
    broken = _mutant_grads(case, names, model, cp_cast, first_batch, reduction=reduction, group=group)
    out.mutants = [
        TrainMutant(
            name=name,
            first_loss=a[0],
            first_grad_norm=a[1],
            first_gdn_output_rel_l2=a[2],
            loss=b[0],
            grad_norm=b[1],
        )
        for name, a, b in zip(names, first_broken, broken, strict=True)
    ]
    for step in range(steps):
        batch = first_batch if step == 0 else _batch(generator, config.vocab_size, case, device)
        with ran.recording() if step == 0 else contextlib.nullcontext() as recording:
            loss, norm = _cp_step(model, cp_cast, optimizer, batch, reduction=reduction, group=group)
        if step == 0:  # what the first step ran, every GDN layer, against the case (bench.measure.gate)
            out.ran = list(recording.calls)
            problems = ran_problems(case, recording, platform.device_type)
            if problems:
                raise CaseCheckError("; ".join(problems))
        out.cp_loss.append(loss)
        out.cp_grad_norm.append(norm)
        if reference is not None and ref_optimizer is not None:
            loss, norm = _reference_step(reference, ref_cast, ref_optimizer, batch)
            out.ref_loss.append(loss)
            out.ref_grad_norm.append(norm)
        if floor is not None:
            loss, norm = _reference_step(*floor, batch)
            out.floor_loss.append(loss)
            out.floor_grad_norm.append(norm)

    shared = [out]
    dist.broadcast_object_list(shared, src=0, group=group)  # rank 0 holds the reference's numbers
    return shared[0]
