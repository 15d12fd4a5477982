"""The device part of `bench doctor`, run on every local device at once (one rank each; two ranks on cpu):
the backend and one collective of each kind the modes use, the matmul limit per dtype on the device's own
clock, the chunked op against the recurrent reference on the device, every local-op backend that runs here
(bench.doctor.kernels), and one layer under each CP mode, with each such backend, against the single-device
layer (training forward and backward, and the serving prefill with its states). Each rank returns its
checks; the command keeps, per check, the worst rank's.

A check that takes every rank (a collective, a mode) runs in a process group of its own, its outcome agreed
through the launch's store (DistributedChecks, on bench.launch.job's CaseRunner): a rank whose check raises
aborts that group and records its error, its peers abort theirs (NCCL: the collective they wait in ends;
gloo: it ends at the check's limit), every rank's row fails with the root cause, and the next check starts
in a new group. A rank that caught its error and went on would leave its peers inside a collective it never
reaches (NCCL: the check's timeout, then the watchdog ends the process).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from bench.doctor.checks import Check, Status
from bench.doctor.kernels import ROUNDING_FACTOR, kernel_checks, layer_backends
from bench.launch.job import CaseRunner, JobStuck, job_store, own_nccl_errors
from bench.measure.throughput import matmul_dtype_name, matmul_gflops
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.accuracy import Thresholds, compare_layer_under_cp, compare_prefill_under_cp, error_stats
from gdn_cp.distributed import MODES, Platform, check_cp_shapes, local_rank, resolve_platform
from gdn_cp.distributed.collectives import all_gather_single
from gdn_cp.ops import DEFAULT_BACKEND, chunk_gated_delta_rule, recurrent_gated_delta_rule

OP_SHAPE = {"B": 1, "T": 512, "Hk": 2, "Hv": 4, "K": 64, "V": 64}
"""The op check's inputs: long enough for several chunks, small enough for seconds on a CPU."""
DOCUMENTS = [0, 37, 200, 201, 512]
"""Packed documents of the op check: boundaries inside and at the edges of chunks, one of one token."""
LAYER = GatedDeltaNetConfig(
    hidden_size=128, num_k_heads=8, num_v_heads=16, head_k_dim=32, head_v_dim=32, chunk_size=64, dtype="fp32"
)
"""The layer checked under each mode: 8 / 16 heads split over up to 8 devices (ulysses)."""
LAYER_TOKENS_PER_RANK = 128
LAYER_BARS = Thresholds(
    output_max_abs=1e-3,
    input_grad_max_abs=1e-3,
    rel_max=1e-3,
    rel_l2=1e-3,
    param_rel_max=1e-2,
    param_rel_l2=1e-2,
    grad_norm_rel=1e-4,
)
"""fp32 bars: ten times cpu-verify's (rel-L2 1e-4 there, from 8-seed maxima of 5e-7), room for a device's
other summation order and TF32 convolutions, still far below what a wrong exchange gives (order 1)."""


class DistributedChecks:
    """Runs each check that takes every rank in a process group of its own over all ranks (the module
    docstring), with `timeout_s` as each check's limit: the group's collective timeout, and on NCCL the
    time after which the group is aborted. Every rank calls `run` for the same checks in the same order."""

    def __init__(self, backend: str, timeout_s: float) -> None:
        if backend == "nccl":
            own_nccl_errors()  # the checks' groups leave errors to their aborts (bench.launch.job)
        timeout = datetime.timedelta(seconds=timeout_s)
        self.runner = CaseRunner(
            backend=backend, timeout_s=timeout_s, store=job_store(timeout), watch_store=job_store(timeout)
        )
        self.stuck: str | None = None
        """Why no further check can run (a group not created or destroyed in time); None while they can."""

    def run(self, group_name: str, name: str, check: Callable[[ProcessGroup], Check]) -> Check:
        """This rank's `check(group)`, or, when it raised on any rank, a failed Check naming the root cause
        (`rank r failed: ...`), the same on every rank."""
        if self.stuck is not None:
            return Check(group_name, name, "fail", f"not run: {self.stuck}")
        mine: list[Check] = []
        try:
            end = self.runner.run(dist.get_world_size(), lambda g: mine.append(check(g)), own_group=True)
        except JobStuck as exc:
            self.stuck = str(exc)
            return Check(group_name, name, "fail", self.stuck)
        if end.error is not None:
            return Check(group_name, name, "fail", end.error.splitlines()[0])
        return mine[0]


def _timed_check(name: str, run: Callable[[], bool], platform: Platform) -> Check:
    """The backend Check `name`: ok with its time when `run()` gives True; fail when False (an exception
    propagates: DistributedChecks turns it into every rank's failed row)."""
    start = time.perf_counter()
    good = run()
    platform.synchronize()
    ms = (time.perf_counter() - start) * 1e3
    status: Status = "ok" if good else "fail"
    return Check("backend", name, status, f"{ms:.1f} ms" + ("" if good else ": wrong values"))


def _barrier_ok(device: torch.device, group: ProcessGroup, rank: int, world: int) -> bool:
    """True once every rank has reached the barrier (the group's first collective: it proves init too)."""
    dist.barrier(group=group)
    return True


def _all_reduce_ok(device: torch.device, group: ProcessGroup, rank: int, world: int) -> bool:
    """Whether summing [1024] of rank + 1 over the ranks gives world (world + 1) / 2 everywhere."""
    t = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(t, group=group)
    return bool((t == world * (world + 1) / 2).all())


def _all_gather_ok(device: torch.device, group: ProcessGroup, rank: int, world: int) -> bool:
    """Whether gathering [256] of each rank's index gives [world * 256], rank r's block filled with r."""
    mine = torch.full((256,), float(rank), device=device)
    got = mine.new_empty(256 * world)
    all_gather_single(got, mine, group=group)
    return bool((got.view(world, -1) == torch.arange(world, device=device).view(-1, 1)).all())


def _all_to_all_ok(device: torch.device, group: ProcessGroup, rank: int, world: int) -> bool:
    """Whether all-to-all of [world * 16] (block j holds j + 100 rank) gives rank r block r of every rank."""
    mine = torch.arange(world, device=device, dtype=torch.float32).repeat_interleave(16) + 100 * rank
    got = torch.empty_like(mine)
    dist.all_to_all_single(got, mine, group=group)
    expected = rank + 100 * torch.arange(world, device=device, dtype=torch.float32).repeat_interleave(16)
    return bool((got == expected).all())


def _ring_ok(device: torch.device, group: ProcessGroup, rank: int, world: int) -> bool:
    """Whether each rank receives [256] of the previous rank's index from isend/irecv around the ring."""
    if world == 1:
        return True
    send = torch.full((256,), float(rank), device=device)
    recv = torch.empty_like(send)
    ops = [  # the group holds every rank: its ranks are the global ones
        dist.P2POp(dist.isend, send, (rank + 1) % world, group=group),
        dist.P2POp(dist.irecv, recv, (rank - 1) % world, group=group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return bool((recv == (rank - 1) % world).all())


def _broadcast_ok(device: torch.device, group: ProcessGroup, rank: int, world: int) -> bool:
    """Whether broadcasting rank 0's [256] of zeros leaves zeros on every rank."""
    t = torch.full((256,), float(rank), device=device)
    dist.broadcast(t, src=0, group=group)
    return bool((t == 0).all())


COLLECTIVES: tuple[tuple[str, Callable[[torch.device, ProcessGroup, int, int], bool]], ...] = (
    ("init + barrier", _barrier_ok),
    ("all-reduce", _all_reduce_ok),
    ("all-gather", _all_gather_ok),
    ("all-to-all", _all_to_all_ok),
    ("isend/irecv ring", _ring_ok),
    ("broadcast", _broadcast_ok),
)
"""(check name, test(device, group, rank, world)) of each collective checked, in the order every rank runs
them."""


def collective_checks(device: torch.device, platform: Platform, checks: DistributedChecks) -> list[Check]:
    """One call of each collective the modes use, its result checked (every rank knows what it must get),
    each in a group of its own."""
    rank, world = dist.get_rank(), dist.get_world_size()
    return [
        checks.run(
            "backend",
            name,
            lambda g, ok=ok, name=name: _timed_check(name, partial(ok, device, g, rank, world), platform),
        )
        for name, ok in COLLECTIVES
    ]


def matmul_checks(device: torch.device, platform) -> list[Check]:
    """The core's products (C x K @ K x V, the reference sizes 64 x 128 x 128) per dtype, on the device's
    clock: fp32 everywhere, tf32 on a GPU, bf16 on an accelerator."""
    dtypes: list[tuple[torch.dtype, bool]] = [(torch.float32, False)]
    if device.type == "cuda":
        dtypes.append((torch.float32, True))
    if device.type != "cpu":
        dtypes.append((torch.bfloat16, False))
    out = []
    for dtype, tf32 in dtypes:
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            gflops = matmul_gflops(64, 128, 128, dtype=dtype, device=device, platform=platform)
            name = matmul_dtype_name(dtype, device)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
        out.append(
            Check("matmul", f"limit {name}", "info", f"{gflops / 1e3:.2f} TFLOP/s (64 x 128 @ 128 x 128)")
        )
    return out


def op_checks(device: torch.device) -> list[Check]:
    """The chunked op on the device in fp32 against the recurrent reference in fp64 on the host, forward
    output and final state, unpacked and with packed documents."""
    s = OP_SHAPE
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k = randn(s["B"], s["T"], s["Hk"], s["K"]), randn(s["B"], s["T"], s["Hk"], s["K"])
    v = randn(s["B"], s["T"], s["Hv"], s["V"])
    g = torch.nn.functional.logsigmoid(randn(s["B"], s["T"], s["Hv"]))
    beta = torch.sigmoid(randn(s["B"], s["T"], s["Hv"]))
    bar = ROUNDING_FACTOR * torch.finfo(torch.float32).eps * math.sqrt(s["T"] * s["K"])
    out = []
    for label, cu in (("unpacked", None), ("packed documents", torch.tensor(DOCUMENTS))):
        kw = {"use_qk_l2norm_in_kernel": True, "output_final_state": True, "cu_seqlens": cu}
        o_ref, h_ref = recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
        moved = [t.to(device, torch.float32) for t in (q, k, v, g, beta)]
        o, h = chunk_gated_delta_rule(*moved, **{**kw, "cu_seqlens": None if cu is None else cu.to(device)})
        worst_rel = max(error_stats(o, o_ref).rel_max, error_stats(h, h_ref).rel_max)
        status: Status = "ok" if worst_rel <= bar else "fail"
        out.append(
            Check(
                "op",
                f"chunk vs recurrent, {label}",
                status,
                f"fp32 rel error {worst_rel:.1e} (bar {bar:.1e})",
            )
        )
    return out


def layer_checks(device: torch.device, backends: list[str], checks: DistributedChecks) -> list[Check]:
    """One layer under each mode at cp = the ranks here, fp32, forward and backward, against the
    single-device layer (gdn_cp.accuracy.compare_layer_under_cp), and its prefill: with the default
    backend, then with each of `backends` (checks named `<mode> (<backend>)`), each in a group of its own."""
    out = []
    for backend in [DEFAULT_BACKEND, *backends]:
        layer = dataclasses.replace(LAYER, backend=backend)
        suffix = "" if backend == DEFAULT_BACKEND else f" ({backend})"
        out += _mode_checks(layer, suffix, device, checks)
    return out


def _mode_checks(
    layer: GatedDeltaNetConfig, suffix: str, device: torch.device, checks: DistributedChecks
) -> list[Check]:
    world = dist.get_world_size()
    out = []
    for mode in MODES:
        name = mode + suffix
        try:
            check_cp_shapes(mode, layer, world)
        except ValueError as exc:  # the same on every rank: no group is needed to say so
            out.append(Check("layer", name, "info", f"not run: {exc}"))
            continue
        out.append(checks.run("layer", name, partial(_layer_check, layer, mode, name, world, device)))
        prefill = partial(_prefill_check, layer, mode, name, world, device)
        out.append(checks.run("layer", f"{name} prefill", prefill))
    return out


def _layer_check(
    layer: GatedDeltaNetConfig,
    mode: str,
    name: str,
    world: int,
    device: torch.device,
    group: ProcessGroup,
) -> Check:
    """The layer under `mode` in `group` (forward and backward) against the single-device layer."""
    result = compare_layer_under_cp(
        layer, mode=mode, seq_len=LAYER_TOKENS_PER_RANK * world, batch=1, seed=0, device=device, group=group
    )
    failures = result.failures(LAYER_BARS)
    detail = (
        f"cp {world}: output rel-L2 {result.output.rel_l2:.1e}, input grad {result.input_grad.rel_l2:.1e}"
    )
    return Check(
        "layer",
        name,
        "fail" if failures else "ok",
        detail + (f"; {', '.join(failures)}" if failures else ""),
    )


def _prefill_check(
    layer: GatedDeltaNetConfig,
    mode: str,
    name: str,
    world: int,
    device: torch.device,
    group: ProcessGroup,
) -> Check:
    """The serving prefill under `mode` in `group` (packed documents, final states on every rank) against the
    single-device prefill (gdn_cp.accuracy.compare_prefill_under_cp), at the layer check's rel-L2 bar."""
    tokens = LAYER_TOKENS_PER_RANK * world
    documents = [0, tokens // 3, tokens // 3 + 1, tokens]  # one spanning ranks, one of one token
    result = compare_prefill_under_cp(
        layer, mode=mode, seq_len=tokens, seed=0, device=device, documents=documents, group=group
    )
    worst = result.worst_rel_l2()
    status: Status = "ok" if worst <= LAYER_BARS.rel_l2 else "fail"
    detail = (
        f"cp {world}: rel-L2 output {result.output.rel_l2:.1e}, conv state {result.conv_state.rel_l2:.1e}, "
        f"recurrent state {result.recurrent_state.rel_l2:.1e} (bar {LAYER_BARS.rel_l2:.0e})"
    )
    return Check("layer", f"{name} prefill", status, detail)


def doctor_on_rank(device_kind: str, timeout_s: float) -> list[Check]:
    """Every device check on this rank (run by run_on_ranks, its device already set); `timeout_s`: each
    check's limit where it takes every rank (DistributedChecks)."""
    platform = resolve_platform(device_kind)
    device = platform.device(local_rank())
    checks = DistributedChecks(platform.backend, timeout_s)
    return [
        *collective_checks(device, platform, checks),
        *matmul_checks(device, platform),
        *op_checks(device),
        *kernel_checks(device, platform.synchronize),
        *layer_checks(device, layer_backends(device), checks),
    ]
