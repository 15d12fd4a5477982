"""Rank functions for the pool tests (test code only): each takes (payload, device) as a pool rank does.

Spawned ranks import this module by name, as tests/gdn_cp/distributed does with cp_ranks. A payload is a tuple
(action, target_rank): the action runs on target_rank, every rank then meets in a barrier and answers.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch.distributed as dist


def act(payload: tuple[str, int], device: str) -> dict:
    """ok: answer; raise: raise; oom: raise MemoryError; exit: os._exit(3); kill: SIGKILL self; stop:
    SIGSTOP self (outside any collective); sleep: sleep outside any collective; all on `target_rank`."""
    action, target = payload
    rank = dist.get_rank()
    if rank == target:
        if action == "raise":
            raise ValueError(f"rank {rank} broke on purpose")
        if action == "oom":
            raise MemoryError(f"rank {rank} could not allocate 1 TiB (injected)")
        if action == "exit":
            os._exit(3)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if action == "sleep":
            time.sleep(600)
    dist.barrier()
    return {"rank": rank, "pid": os.getpid(), "world": dist.get_world_size(), "action": action}


def listening(owner_pid: int, device: str) -> dict:
    """What the pool's owner (process `owner_pid`: not this rank's parent, the server ranks fork from)
    listens on, once every rank is connected."""
    dist.barrier()
    return {"parent": _listening(owner_pid)}


def _listening(pid: int) -> list[str]:
    """ "ip:port" of the TCP sockets process `pid` listens on (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                host, port = local.split(":")
                if len(host) == 8:
                    ip = ".".join(str(int(host[i : i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    ip = "::" if set(host) == {"0"} else host
                out.append(f"{ip}:{int(port, 16)}")
    return out
