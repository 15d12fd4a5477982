"""Start local ranks from inside a program (bench's commands, the tests) with torch.distributed's elastic
launcher, or as a pool (bench.launch.pool), forked from one server process (rank_context).

Each rank runs `fn(*args)` inside an initialised process group on 127.0.0.1, with an explicit thread count
and a collective timeout, so that a bug fails fast instead of hanging. A library user starts ranks with
torchrun instead, and joins the group with gdn_cp.distributed.process_group.

Nothing listens beyond this host: the launcher's rendezvous is LoopbackRendezvous, whose store (the one the
ranks bootstrap from) is bound to 127.0.0.1 on a free port. torch's own c10d and static rendezvous host
their TCPStores on every interface whatever host the endpoint names (`is_host` and `local_addr` only
choose who hosts it and what address the ranks are told), so they are not used. Nothing outlives the
launcher either: the server and every rank die with it, even when it is SIGKILLed (bench.launch.lifeline).
"""

from __future__ import annotations

import ast
import datetime
import multiprocessing
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure, record
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from bench.launch import lifeline
from bench.launch.user_backends import prepare_rank, rank_env
from gdn_cp.distributed.platform import resolve_platform
from gdn_cp.distributed.process_group import init_rank_group, teardown_process_group


class RankFailure(RuntimeError):
    """A rank raised, died or timed out. `.rank` is the first failing rank, `.message` its error."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"rank {rank} failed: {message}")
        self.rank = rank
        self.message = message


LOOPBACK = "127.0.0.1"
RENDEZVOUS_BACKEND = "bench-loopback"
"""The name LoopbackRendezvous is registered under (torch's rendezvous handler registry)."""

START_METHOD = "forkserver"
"""How local ranks start: forked from a server process that imported torch once (rank_context), not spawned
(a fresh interpreter importing torch again: seconds per rank on a small machine). Each rank is still a
process of its own, with its own allocator and process group."""


def _guards_main(test: ast.expr) -> bool:
    """Is `test` the condition `__name__ == "__main__"` (either way round)?"""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


def check_main_guarded() -> None:
    """RuntimeError, saying what to add, when this call comes from the top level of a script (the __main__
    module run from a file) outside `if __name__ == "__main__":`.

    Every local rank starts from multiprocessing's forkserver, and a process started that way imports the
    parent's main script again before it runs (multiprocessing's "safe importing of the main module"): an
    unguarded call would run again in every rank, which then exits with code 1 and no Python error of its
    own. Scripts run with `python -m pkg` (a package's __main__) are not re-imported and pass.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if main is None or path is None or (spec is not None and spec.name.endswith("__main__")):
        return
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:  # called from a function (a test, a guarded main()): nothing runs at import
        return
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return  # cannot read the script: let the launch speak for itself
    line = frame.f_lineno
    if any(
        isinstance(node, ast.If) and _guards_main(node.test) and node.lineno <= line <= (node.end_lineno or 0)
        for node in ast.walk(tree)
    ):
        return
    raise RuntimeError(
        f"{path}:{line} starts ranks from the top level of the script: every rank imports the script again "
        "before it runs (multiprocessing's forkserver), which would run this line again in each; put it "
        'under `if __name__ == "__main__":`'
    )


def rank_context(preload: Iterable[str] = ()) -> multiprocessing.context.BaseContext:
    """The multiprocessing context local ranks start from (START_METHOD), its server started now, armed to
    die with this process (bench.launch.lifeline, first of its preload list), preloading torch, this module
    and `preload` (module names: the rank function's).

    The server serves every later launch of this program; the preload list only counts until it starts, so
    a module not in it is imported by each rank as it unpickles the function (correct, only slower). Ranks
    see the environment the server started with plus what their launcher sets (LaunchConfig's, RankPool's
    `env`). Call it from the main thread (a server started from another is not armed: lifeline).
    RuntimeError when called from an unguarded script (check_main_guarded).
    """
    check_main_guarded()
    ctx = multiprocessing.get_context(START_METHOD)
    ctx.set_forkserver_preload([lifeline.__name__, "torch", "torch.distributed", __name__, *preload])
    lifeline.start_server()
    return ctx


def loopback_store(timeout: datetime.timedelta) -> dist.TCPStore:
    """A TCPStore hosted by this process on 127.0.0.1, on a free port (`.port`): the socket is bound and
    listening before the store takes it (`master_listen_fd`), so it accepts no connection from another
    machine. It stops listening when the last reference to it goes."""
    sock = socket.create_server((LOOPBACK, 0))  # bound and listening, on a free port
    try:
        store = dist.TCPStore(
            LOOPBACK,
            sock.getsockname()[1],
            is_master=True,
            multi_tenant=True,
            timeout=timeout,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now, and closes it
    return store


class LoopbackRendezvous(RendezvousHandler):
    """The rendezvous of a one-host launch: this process is the only node, and it hosts the store its ranks
    bootstrap from (MASTER_ADDR/MASTER_PORT) on a socket bound to 127.0.0.1, handed to the TCPStore
    (`master_listen_fd`), so that it accepts no connection from another machine."""

    def __init__(self, run_id: str, timeout: datetime.timedelta) -> None:
        self._run_id = run_id
        self._timeout = timeout
        self._store: dist.TCPStore | None = None
        self._closed = False

    def get_backend(self) -> str:
        return RENDEZVOUS_BACKEND

    @property
    def use_agent_store(self) -> bool:
        """The ranks use this store (TORCHELASTIC_USE_AGENT_STORE): no rank hosts one of its own."""
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            self._store = loopback_store(self._timeout)
        store_info = RendezvousStoreInfo(master_addr=LOOPBACK, master_port=self._store.port)
        return RendezvousInfo(dist.PrefixStore(self._run_id, self._store), 0, 1, store_info)

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0  # one node, never more

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        self._store = None  # the last reference: the server stops listening
        return True


def _loopback_rendezvous(params: RendezvousParameters) -> LoopbackRendezvous:
    seconds = params.get_as_int("timeout", 900)
    return LoopbackRendezvous(params.run_id, datetime.timedelta(seconds=seconds or 900))


rendezvous_handler_registry.register(RENDEZVOUS_BACKEND, _loopback_rendezvous)


def default_threads_per_rank(world_size: int) -> int:
    """Cores divided by ranks, at least one."""
    return max(1, (os.cpu_count() or 1) // world_size)


PEER_ERRORS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Connection refused")
"""Transport errors a rank sees when another rank died first: never the root cause."""


def is_peer_error(message: str) -> bool:
    """Whether a rank's error is the echo of another rank's failure (PEER_ERRORS)."""
    return any(text in message for text in PEER_ERRORS)


@record
def _rank_main(
    fn: Callable[..., Any], args: tuple, threads: int, device: str, timeout_s: float, env: dict[str, str]
) -> Any:
    os.environ.update(env)
    torch.set_num_threads(threads)
    init_rank_group(resolve_platform(device), datetime.timedelta(seconds=timeout_s))
    backends = prepare_rank()  # the user's backends (bench.launch.user_backends), the device set
    try:
        result = fn(*args)
    except Exception as exc:
        if is_peer_error(str(exc)):
            # Another rank failed first and closed its connections: let its error reach the launcher
            # first (failures are ordered by a timestamp in whole seconds).
            time.sleep(1.5)
        # No destroy_process_group here: closing connections now would make the other ranks fail with
        # "connection reset" before this rank's own error is recorded.
        explained = backends.explain(exc)
        if explained is not exc:
            raise explained from None
        raise
    teardown_process_group(datetime.timedelta(seconds=timeout_s))
    return result


def _describe(failure: ProcessFailure) -> str:
    """A failed rank's error: its Python exception (from its error file), else how the process ended."""
    if failure.exitcode < 0:  # killed by a signal: no error file
        name = failure.signal_name()
        hint = " (SIGKILL: often the out-of-memory killer)" if name == "SIGKILL" else ""
        return f"killed by signal {name}{hint}"
    if failure.error_file_data.get("errorTraits", {}).get("category") == "system_terminated_error":
        # elastic's marker for a process that exited without writing an error file
        return f"exited with code {failure.exitcode} without a Python exception (os._exit or a native crash)"
    message = failure.message
    if isinstance(message, dict):  # {"message": ..., "extraInfo": {"py_callstack": ...}}
        message = message.get("message", str(message))
    return str(message)


def _root_cause(exc: ChildFailedError) -> tuple[int, str]:
    """The failure to report: the earliest that is not a peer's transport error, else the earliest."""
    described = {rank: _describe(f) for rank, f in exc.failures.items()}
    rank = min(exc.failures, key=lambda r: (is_peer_error(described[r]), exc.failures[r].timestamp, r))
    return rank, described[rank]


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
        env: extra environment variables for the ranks (beside bench.launch.user_backends.rank_env: the
            user's backends, which every rank imports)
    Raises:
        RankFailure: a rank raised, died or timed out; the message is the root cause: the first failing
            rank's exception (not another rank's "connection reset" that followed), or how it died.
    """
    threads = threads_per_rank or default_threads_per_rank(world_size)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        rdzv_backend=RENDEZVOUS_BACKEND,  # its store on 127.0.0.1, a free port
        local_addr=LOOPBACK,
        run_id=uuid.uuid4().hex,
        max_restarts=0,
        monitor_interval=0.05,
        start_method=START_METHOD,
    )
    rank_context([fn.__module__])  # the server elastic_launch forks from: preload the rank function's module
    try:
        ranks_env = {**rank_env(), **(env or {})}
        results = elastic_launch(config, _rank_main)(fn, args, threads, device, timeout_s, ranks_env)
    except ChildFailedError as exc:
        raise RankFailure(*_root_cause(exc)) from None
    return [results[rank] for rank in range(world_size)]
