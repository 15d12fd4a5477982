"""Measure the alpha-beta links of this host's backend: a short micro-benchmark on real ranks.

At each world size, every kind is timed at a few buffer sizes (SIZES): a p2p ping-pong between ranks 0 and
1 (half the round trip), and an all-gather, all-to-all and all-reduce of the whole group; each point is
the median of REPEATS calls after a warmup, and the slowest rank's (a collective ends when its last rank
does). `fit_link` then fits latency and bandwidth per kind over every world size together. It takes about
ten seconds per world size on a 2-core CPU.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist

from bench.launch.launcher import torchrun_env
from bench.launch.local import run_on_ranks
from bench.model.links import LINK_KINDS, Interconnect, fit_link
from gdn_cp.distributed import init_rank_group, local_rank, resolve_platform, teardown_process_group
from gdn_cp.distributed.collectives import all_gather_single
from gdn_cp.distributed.comm_stats import ALL_GATHER, ALL_TO_ALL, P2P

SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
"""Per-rank buffer bytes: 1 KiB (latency) to 4 MiB (bandwidth), spanning a state [B, Hv, K, V] in fp32
(Hv 8, K = V 32: 32 KiB) to a packed summary at Qwen3.5's sizes (Hv 32, K = V 128: 4 MiB)."""
REPEATS = 10
WARMUP = 2


def _call(kind: str, buf: torch.Tensor, out: torch.Tensor) -> None:
    rank = dist.get_rank()
    if kind == P2P:
        # Ping-pong between ranks 0 and 1: the round trip is two one-way messages.
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    elif kind == ALL_GATHER:
        all_gather_single(out, buf)  # the name torch 2.13 keeps (no FutureWarning)
    elif kind == ALL_TO_ALL:
        dist.all_to_all_single(out[: buf.numel()], buf)
    else:
        dist.all_reduce(buf)


def calibration_rank(
    sizes: tuple[int, ...], repeats: int, device_kind: str = "cpu"
) -> list[tuple[str, int, int, float]]:
    """On every rank: (kind, cp, bytes, seconds of one call, the slowest rank's median) for each point, with
    the buffers on this rank's device (the backend's own path: NCCL/HCCL between devices, gloo on cpu)."""
    cp = dist.get_world_size()
    platform = resolve_platform(device_kind)
    device = platform.device(local_rank())
    out = []
    for kind in LINK_KINDS:
        for nbytes in sizes:
            n = nbytes // 4
            n -= n % cp  # all-to-all splits the buffer evenly
            buf = torch.ones(n, dtype=torch.float32, device=device)
            gathered = torch.empty(n * cp, dtype=torch.float32, device=device)
            times = []
            for i in range(WARMUP + repeats):
                dist.barrier()
                platform.synchronize()
                start = time.perf_counter()
                _call(kind, buf, gathered)
                platform.synchronize()
                if i >= WARMUP:
                    times.append(time.perf_counter() - start)
            median = torch.tensor(statistics.median(times), dtype=torch.float32, device=device)
            dist.all_reduce(median, op=dist.ReduceOp.MAX)
            seconds = median.item() / (2 if kind == P2P else 1)
            out.append((kind, cp, n * 4, seconds))
    return out


def calibrate(
    world_sizes: tuple[int, ...],
    *,
    device: str = "cpu",
    sizes: tuple[int, ...] = SIZES,
    repeats: int = REPEATS,
    timeout_s: float = 120,
) -> Interconnect:
    """Launch each world size on this host's devices, time every kind, fit the links (gloo between CPU
    ranks on loopback, NCCL/HCCL between the node's devices). Under torchrun, this process is one rank of
    the job and the job's world size is the one measured, across its nodes."""
    platform = resolve_platform(device)
    samples = []
    if torchrun_env() is not None:
        init_rank_group(platform, datetime.timedelta(seconds=timeout_s))
        try:
            samples = calibration_rank(sizes, repeats, platform.device_type)
        finally:
            teardown_process_group(datetime.timedelta(seconds=timeout_s))
        world_sizes = (int(os.environ["WORLD_SIZE"]),)
    else:
        for cp in world_sizes:
            samples += run_on_ranks(
                calibration_rank,
                cp,
                (sizes, repeats, platform.device_type),
                device=device,
                timeout_s=timeout_s,
            )[0]
    links = {
        kind: fit_link(kind, [(cp, n, s) for k, cp, n, s in samples if k == kind]) for kind in LINK_KINDS
    }
    where = "across the job's nodes" if torchrun_env() is not None else "on this host"
    return Interconnect(
        name=f"{platform.backend} {where}, cp {', '.join(map(str, world_sizes))}",
        source="measured (bench model calibrate)",
        links=links,
        samples=[{"kind": k, "cp": cp, "bytes": n, "seconds": s} for k, cp, n, s in samples],
        device=platform.device_type,
    )
