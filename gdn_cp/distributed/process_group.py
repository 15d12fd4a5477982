"""Joining and leaving the process group on a rank, however its process was started (torchrun, or bench's
local launcher, bench.launch.local): this host's rank and rank count, the group bound to this rank's
device, and a teardown that does not reset a peer's last transfers.

    init_rank_group(resolve_platform("auto"), datetime.timedelta(minutes=10))
    ...                                      # the CP layers, on platform.device(local_rank())
    teardown_process_group()
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch.distributed as dist

from gdn_cp.distributed.platform import Platform


def local_rank() -> int:
    """This process's rank on its host (LOCAL_RANK, set by torchrun and bench's launchers; 0 when unset):
    the index of the accelerator it uses."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size() -> int:
    """Ranks on this host (LOCAL_WORLD_SIZE, set by torchrun and bench's launchers; else the world size,
    else 1): what shares this host's cores and memory."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return dist.get_world_size() if dist.is_initialized() else 1


def init_rank_group(platform: Platform, timeout: datetime.timedelta, **kwargs: Any) -> None:
    """Join the process group as this process's rank: set_device(LOCAL_RANK) first, then init_process_group
    with the platform's backend and, on an accelerator, `device_id` = that device. NCCL (and HCCL) then bind
    the communicator to it at once instead of guessing at the first collective (a barrier guesses device
    `rank % count`; a batch_isend_irecv as the first collective needs the bound device). `kwargs` go to
    init_process_group (store, rank, world_size)."""
    index = local_rank()
    platform.set_device(index)
    device_id = None if platform.device_type == "cpu" else platform.device(index)
    dist.init_process_group(platform.backend, timeout=timeout, device_id=device_id, **kwargs)


TEARDOWN_KEY = "gdn_cp/teardown/{attempt}/{rank}"
"""The store key each rank sets when it reaches `teardown_process_group` (per torchrun restart attempt)."""


def teardown_process_group(timeout: datetime.timedelta | None = None) -> None:
    """destroy_process_group once every rank of the default group has got here: a barrier through the store
    (which stays up), not through the backend's own connections, which are the ones being closed.

    Why: a rank's communication is over when its works complete, but a peer's may not be. gloo completes a
    send once its bytes are written to the local socket, not once the peer has read them, and destroying the
    group closes every connection at once (gloo's hard close resets it: SO_LINGER 0). A rank that finishes
    first, typically the one whose last operation is a send (the last hop of p2p's backward chain, scan's
    round-0 shift backward at the last rank, an all-gather that completed on one rank before another), would
    reset its peers' connections while they still read its last message: their receive fails with
    "Connection reset by peer", or gloo's I/O thread aborts the process ("terminate called without an active
    exception") when the peer is itself tearing down, which is what skewed timing (a loaded machine) exposed.
    Once every rank is here, every rank's works are complete, so nothing in flight is still needed.
    """
    if not dist.is_initialized():
        return
    world = dist.get_world_size()
    if world > 1:
        # The store the group was built on (the one every rank shares); torch keeps it with the default group.
        store = dist.distributed_c10d._get_default_store()
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store.set(TEARDOWN_KEY.format(attempt=attempt, rank=dist.get_rank()), "1")
        keys = [TEARDOWN_KEY.format(attempt=attempt, rank=r) for r in range(world)]
        if timeout is None:
            store.wait(keys)
        else:
            store.wait(keys, timeout)
    dist.destroy_process_group()
