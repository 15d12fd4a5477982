"""What a launcher knows of this host's accelerators without a device context of its own.

The first query of a device creates a context on it (gdn_cp.distributed.platform), so a launcher reads
them with `read_devices` in a short-lived child forked from the ranks' server (bench.launch.local): no
context in the launcher, and no torch import to pay in the child.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bench.launch.local import rank_context
from gdn_cp.distributed.platform import DeviceInfo, Platform, PlatformError, read_devices, resolve_platform

PROBE_TIMEOUT_S = 120.0
"""How long the device probe may take (a context per device; seconds on a node of 8 GPUs)."""


def _probe_main(device_type: str, conn: Any) -> None:
    conn.send(read_devices(resolve_platform(device_type)))
    conn.close()


_probed: dict[str, tuple[DeviceInfo, ...]] = {}


def probe_devices(platform: Platform) -> tuple[DeviceInfo, ...]:
    """Every accelerator of this host (name, free and total memory), read once per process by a short-lived
    child, so that this process, a launcher, never creates a device context; () on cpu. PlatformError when
    the probe fails."""
    if platform.device_type == "cpu":
        return ()
    if platform.device_type not in _probed:
        ctx = rank_context()
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_probe_main, args=(platform.device_type, send), daemon=True)
        child.start()
        send.close()
        found = None
        if receive.poll(PROBE_TIMEOUT_S):
            with contextlib.suppress(EOFError):  # the probe died before it answered
                found = receive.recv()
        child.join(5)
        if found is None:
            child.kill()
            raise PlatformError(
                f"reading this host's {platform.device_type} devices failed (the probe process exited with "
                f"{child.exitcode}, or took over {PROBE_TIMEOUT_S:.0f} s); check the driver with "
                "`bench doctor`"
            )
        _probed[platform.device_type] = found
    return _probed[platform.device_type]


def host_device_name(platform: Platform, local_rank: int | None = None) -> str:
    """The name of this host's devices (the CPU's on cpu; distinct accelerator names joined): a launcher
    (`local_rank` None) reads them from the probe (probe_devices), a torchrun rank from its own device,
    which it chooses first."""
    if platform.device_type == "cpu":
        return platform.device_name(0)
    if local_rank is not None:
        platform.set_device(local_rank)
        return platform.device_name(local_rank)
    names = sorted({d.name for d in probe_devices(platform)})
    return ", ".join(names) or f"no {platform.device_type} device"
