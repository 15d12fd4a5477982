"""The loop each rank of a pool runs (bench.launch.pool): join the process group, then run one case per
message from the parent until told to stop.

Protocol over the rank's pipe (parent -> rank): `(index, payload)` to run `fn(payload, device)`, None to
leave. Rank -> parent: `("ready", rank, main_thread_id)` once in the process group; per case
`("done", index, value)` (value: rank 0's return value, None on the other ranks) or `("error", index,
message)`. After an error the rank leaves: the process group may hold half a collective, so the parent
starts a new pool rather than reuse it. The rank dumps its Python stacks to `dump_path` on SIGUSR1
(bench.launch.stuck). It dies with the server it was forked from, which dies with the launcher
(bench.launch.lifeline, armed right after the fork), so that a killed `bench run` leaves no ranks behind;
where that cannot be armed (not Linux), it leaves when its pipe to the launcher closes.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from bench.launch.local import LOOPBACK, is_peer_error
from bench.launch.stuck import DUMP_SIGNAL
from bench.launch.user_backends import RankBackends, prepare_rank
from gdn_cp.distributed.platform import resolve_platform
from gdn_cp.distributed.process_group import init_rank_group, teardown_process_group


@dataclass(frozen=True, slots=True)
class RankSetup:
    """What a pool rank needs to start (picklable: it crosses to the new process)."""

    rank: int
    world_size: int
    store_port: int
    """The parent's TCPStore on 127.0.0.1 (bench.launch.local.loopback_store)."""
    prefix: str
    """This pool's key prefix in the store."""
    device: str
    threads: int
    """torch intra-op threads."""
    timeout_s: float
    """Collective timeout."""
    fn: Callable[[Any, str], Any]
    """The rank function: fn(payload, device), module-level."""
    env: dict[str, str]
    """Extra environment variables."""
    dump_path: str
    """Where faulthandler writes this rank's stacks on SIGUSR1."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def rank_main(setup: RankSetup, conn: Connection) -> None:
    """The entry point of a pool rank (a new process, bench.launch.pool)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent too, which ends the pool
    # kept open for the process's lifetime: faulthandler writes to it from its signal handler
    dump = open(setup.dump_path, "w")  # noqa: SIM115
    faulthandler.register(DUMP_SIGNAL, file=dump, all_threads=True)
    os.environ.update(setup.env)
    os.environ.update(
        RANK=str(setup.rank),
        LOCAL_RANK=str(setup.rank),
        WORLD_SIZE=str(setup.world_size),
        LOCAL_WORLD_SIZE=str(setup.world_size),
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(setup.store_port),
    )
    torch.set_num_threads(setup.threads)
    timeout = datetime.timedelta(seconds=setup.timeout_s)
    store = dist.TCPStore(LOOPBACK, setup.store_port, is_master=False, timeout=timeout)
    init_rank_group(
        resolve_platform(setup.device),
        timeout,
        store=dist.PrefixStore(setup.prefix, store),
        rank=setup.rank,
        world_size=setup.world_size,
    )
    # the user's backends (bench.launch.user_backends) once the device is set: a kernel package may use it
    unusable: ImportError | None = None
    try:
        backends = prepare_rank()
    except ImportError as exc:  # a backend module this rank cannot import: its first case fails with it
        backends, unusable = RankBackends(), exc
    # What is alive now (modules, torch) stays alive: leave it out of every later collection, so that the
    # gc.collect() before a memory reading (bench.measure.memory) takes milliseconds instead of 0.1 s.
    gc.freeze()
    conn.send(("ready", setup.rank, threading.main_thread().ident))
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            os._exit(1)
        if message is None:
            break
        index, payload = message
        try:
            if unusable is not None:
                raise unusable
            value = setup.fn(payload, setup.device)
        except Exception as exc:
            text = _describe(backends.explain(exc))
            if is_peer_error(text):
                # Another rank failed first and closed its connections: let its own error reach the parent
                # first.
                time.sleep(0.5)
            conn.send(("error", index, text))
            conn.close()
            # No destroy_process_group: closing connections now would make the other ranks fail with
            # "connection reset" before this rank's error is read. The parent kills the pool.
            os._exit(1)
        conn.send(("done", index, value if setup.rank == 0 else None))
    teardown_process_group(timeout)
    conn.close()
