"""Functions the launcher's tests run in its processes (bench.launch.local): a rank that fails in a chosen
way, what each rank sees, what a launch listens on, and a process's parent-death signal. Module-level, so
that the ranks import them by name."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import time
from typing import Any

import torch
import torch.distributed as dist


def fail(how: str) -> int:
    """Rank 1 fails in the way named; the others wait in a collective (and see the failure second-hand)."""
    if dist.get_rank() == 1:
        if how == "raise":
            raise ValueError("rank 1 broke on purpose")
        if how == "exit":
            os._exit(3)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "hang":
            time.sleep(60)
    dist.barrier()
    return dist.get_rank()


def rank_and_threads() -> tuple[int, int, int]:
    return dist.get_rank(), dist.get_world_size(), torch.get_num_threads()


def _listening(pid: int) -> list[str]:
    """The local addresses (host:port) process `pid` listens on over TCP, from /proc (Linux)."""
    fd_dir = f"/proc/{pid}/fd"
    inodes = set()
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                hex_addr, hex_port = local.split(":")
                raw = bytes.fromhex(hex_addr)  # 32-bit words in host (little-endian) order
                packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.append(f"{socket.inet_ntop(family, packed)}:{int(hex_port, 16)}")
    return found


def listening_addresses(launcher_pid: int) -> dict[str, list[str]]:
    """Rank 0, once every rank is connected: what the launching process (`launcher_pid`: not this rank's
    parent, the server ranks fork from) and each rank listen on."""
    dist.barrier()
    mine = _listening(os.getpid())
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {"launcher": _listening(launcher_pid), "ranks": [a for addresses in every for a in addresses]}


def exit_with_parent_death_signal() -> None:
    """Exit with this process's parent-death signal as its code (0: none), read with prctl (Linux)."""
    value = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
    os._exit(value.value)
