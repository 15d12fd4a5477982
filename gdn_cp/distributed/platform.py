"""One place that knows devices: which device and collective backend, how to synchronise, peak memory.

auto -> npu (torch_npu importable and a device present), else cuda (a GPU present), else cpu
npu  -> hccl,  cuda -> nccl,  cpu -> gloo

A process queries an accelerator only after `set_device` chose it (`memory_info`, `device_name` and
`synchronize` raise otherwise): the first query of a device creates a context on it (hundreds of MiB, and
in EXCLUSIVE_PROCESS mode the device is then taken), so a launcher that asked device 0 before its ranks
started would hold one on every node's GPU 0 and keep rank 0 out of it. A launcher learns the devices from
`read_devices`, run in a short-lived child process (bench's does: bench.launch.devices.probe_devices).
"""

from __future__ import annotations

import importlib
import platform as _host
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch

DeviceKind = Literal["auto", "cpu", "cuda", "npu"]
"""Where ranks run: auto picks npu, then cuda, then cpu."""
DEVICES: tuple[str, ...] = get_args(DeviceKind)
BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


class PlatformError(RuntimeError):
    """The asked-for device cannot be used here; the message says what to install or choose."""


_chosen: dict[str, int] = {}
"""Device type -> the index `set_device` chose in this process (none: no device may be queried)."""


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One accelerator of this host, as `read_devices` found it."""

    index: int
    name: str
    free_bytes: int
    total_bytes: int


def _npu_module():
    """torch.npu after importing torch_npu, or None when torch_npu is not installed."""
    try:
        importlib.import_module("torch_npu")
    except ImportError:
        return None
    return getattr(torch, "npu", None)


@dataclass(frozen=True, slots=True)
class Platform:
    """A resolved device type and its collective backend."""

    device_type: Literal["cpu", "cuda", "npu"]
    backend: str

    def device(self, local_rank: int = 0) -> torch.device:
        return (
            torch.device("cpu") if self.device_type == "cpu" else torch.device(self.device_type, local_rank)
        )

    def _module(self):
        return getattr(torch, self.device_type)

    def set_device(self, local_rank: int) -> None:
        """Make device `local_rank` this process's (the first call that may create a context on it)."""
        if self.device_type != "cpu":
            self._module().set_device(local_rank)
            _chosen[self.device_type] = local_rank

    def _check_chosen(self, index: int | None, what: str) -> None:
        """PlatformError when device `index` (None: any) is queried before set_device chose it (module
        docstring)."""
        chosen = _chosen.get(self.device_type)
        if chosen is None or (index is not None and chosen != index):
            raise PlatformError(
                f"{what} of {self.device_type}:{'?' if index is None else index} asked before set_device "
                "chose it in this process: that would create a context on the device; call set_device "
                "first, or read the devices with read_devices in a child process from a launcher "
                "(bench.launch.devices.probe_devices)"
            )

    def time_s(self, fn: Callable[[], object], calls: int = 1) -> float:
        """Seconds one call of `fn` takes on this device, averaged over `calls` back-to-back calls: on an
        accelerator between two device events on the current stream (the device's own clock: a host
        timer around a short kernel measures the launch and the sync, not the kernel); on cpu with
        perf_counter."""
        if self.device_type == "cpu":
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - start) / calls
        self._check_chosen(None, "time_s")
        module = self._module()
        begin, end = module.Event(enable_timing=True), module.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3 / calls  # elapsed_time is in milliseconds

    def synchronize(self) -> None:
        """Wait for queued device work; a no-op on cpu, where ops run synchronously."""
        if self.device_type != "cpu":
            self._check_chosen(None, "synchronize")
            self._module().synchronize()

    @property
    def has_allocator_stats(self) -> bool:
        """Whether the device allocator tracks peak memory (npu, cuda). On cpu use a profiler meter."""
        return self.device_type != "cpu"

    def reset_peak_memory(self) -> None:
        if self.has_allocator_stats:
            self._module().reset_peak_memory_stats()

    def empty_cache(self) -> None:
        """Release the allocator's cached blocks to the device (npu, cuda; a no-op on cpu), so that what the
        device reports in use is what is allocated now, not what earlier work left cached."""
        if self.has_allocator_stats:
            self._module().empty_cache()

    def memory_allocated(self) -> int:
        """Bytes held by the device allocator now (0 on cpu, which has no allocator statistics)."""
        return self._module().memory_allocated() if self.has_allocator_stats else 0

    def max_memory_allocated(self) -> int:
        """Peak bytes since the last `reset_peak_memory` (npu, cuda); PlatformError on cpu."""
        if not self.has_allocator_stats:
            raise PlatformError(
                "cpu has no allocator peak; measure with bench.measure.memory's profiler meter"
            )
        return self._module().max_memory_allocated()

    def max_memory_reserved(self) -> int:
        """Peak bytes the allocator reserved from the device since the last `reset_peak_memory`, its cached
        blocks included (npu, cuda); PlatformError on cpu."""
        if not self.has_allocator_stats:
            raise PlatformError("cpu has no allocator; measure with bench.measure.memory's profiler meter")
        return self._module().max_memory_reserved()

    def device_count(self) -> int | None:
        """Accelerators visible to this process (npu, cuda); None on cpu, where ranks share the cores."""
        return None if self.device_type == "cpu" else self._module().device_count()

    def memory_info(self, local_rank: int) -> tuple[int, int] | None:
        """(free, total) bytes of this rank's device (npu, cuda: mem_get_info, after set_device); None on
        cpu, whose ranks share the host's memory (read /proc/meminfo)."""
        if self.device_type == "cpu":
            return None
        self._check_chosen(local_rank, "memory_info")
        return tuple(self._module().mem_get_info(local_rank))  # type: ignore[return-value]

    def device_name(self, local_rank: int) -> str:
        """The device's name (after set_device on an accelerator); the CPU's on cpu."""
        if self.device_type == "cpu":
            return _host.processor() or _host.machine()
        self._check_chosen(local_rank, "device_name")
        return self._module().get_device_name(local_rank)


def read_devices(platform: Platform) -> tuple[DeviceInfo, ...]:
    """Every accelerator of this host, each chosen with set_device before it is queried (a context on each:
    run it in a process of its own, as bench.launch.devices.probe_devices does); () on cpu."""
    if platform.device_type == "cpu":
        return ()
    out = []
    for index in range(platform.device_count() or 0):
        platform.set_device(index)
        info = platform.memory_info(index)
        assert info is not None
        out.append(DeviceInfo(index, platform.device_name(index), info[0], info[1]))
    return tuple(out)


def resolve_platform(device: str = "auto") -> Platform:
    """The Platform for `device` ("auto", "cpu", "cuda", "npu"); PlatformError if it cannot run here."""
    if device not in DEVICES:
        raise PlatformError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if device == "auto":
        npu = _npu_module()
        if npu is not None and npu.is_available():
            device = "npu"
        elif torch.cuda.is_available():
            device = "cuda"
        else:
            device = "cpu"
    elif device == "npu":
        npu = _npu_module()
        if npu is None:
            raise PlatformError(
                "device 'npu' needs torch-npu: install it with `pip install -e '.[npu]'` (and the CANN "
                "toolkit), or choose --device cpu"
            )
        if not npu.is_available():
            raise PlatformError(
                "device 'npu': torch_npu imports but sees no NPU; check the driver, or choose cpu"
            )
    elif device == "cuda" and not torch.cuda.is_available():
        built = torch.version.cuda or "no CUDA (a CPU build)"
        raise PlatformError(
            f"device 'cuda': no GPU visible to torch {torch.__version__} (built with {built}); install a "
            "CUDA build of torch on a GPU machine, or choose --device cpu"
        )
    return Platform(device_type=device, backend=BACKENDS[device])  # type: ignore[arg-type]
