"""Start local ranks from inside a program (a CLI, a test) with torch.distributed's elastic launcher.

Each rank runs `fn(*args)` inside an initialised process group on 127.0.0.1 (the launcher picks a free
port), with an explicit thread count and a collective timeout, so that a bug fails fast instead of hanging.
Under torchrun, call `fn` directly instead: the process group comes from the environment.
"""

from __future__ import annotations

import datetime
import os
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from gdn_cp.distributed.platform import resolve_platform


class RankFailure(RuntimeError):
    """A rank raised, died or timed out. `.rank` is the first failing rank, `.message` its error."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"rank {rank} failed: {message}")
        self.rank = rank
        self.message = message


def default_threads_per_rank(world_size: int) -> int:
    """Cores divided by ranks, at least one."""
    return max(1, (os.cpu_count() or 1) // world_size)


@record
def _rank_main(
    fn: Callable[..., Any], args: tuple, threads: int, device: str, timeout_s: float, env: dict[str, str]
) -> Any:
    os.environ.update(env)
    torch.set_num_threads(threads)
    platform = resolve_platform(device)
    platform.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(platform.backend, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        return fn(*args)
    finally:
        dist.destroy_process_group()


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    device: str = "cpu",
    threads_per_rank: int | None = None,
    timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run fn(*args) on `world_size` new local processes; return each rank's return value, by rank.

    Args:
        fn: a picklable (module-level) function; it runs after init_process_group
        world_size: number of ranks
        args: picklable arguments, the same for every rank
        device: "cpu" (gloo), "cuda" (nccl), "npu" (hccl) or "auto"
        threads_per_rank: torch threads per rank; default cores // world_size
        timeout_s: collective timeout; a rank stuck in a collective longer than this fails
        env: extra environment variables for the ranks
    Raises:
        RankFailure: a rank raised or died; the message is that rank's error.
    """
    threads = threads_per_rank or default_threads_per_rank(world_size)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",  # port 0: the launcher binds a free port, as torchrun --standalone
        run_id=uuid.uuid4().hex,
        max_restarts=0,
        monitor_interval=0.05,
        start_method="spawn",
    )
    try:
        results = elastic_launch(config, _rank_main)(fn, args, threads, device, timeout_s, dict(env or {}))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        message = failure.message
        if isinstance(message, dict):  # an error file: {"message": ..., "extraInfo": {"py_callstack": ...}}
            message = message.get("message", str(message))
        raise RankFailure(rank, str(message) or f"exit code {failure.exitcode}") from None
    return [results[rank] for rank in range(world_size)]
