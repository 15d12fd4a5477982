"""gdn_cp.distributed.platform: device choice, backends, and clear errors where hardware is missing.

The npu and cuda paths run against stand-ins for torch.cuda and torch_npu that record which of their
documented functions were called; what a host without an accelerator does is tested with torch.cuda saying
so, so that the tests hold on a GPU host too (docs/clusters.md runs them there).
"""

from __future__ import annotations

import datetime
import sys
import types

import pytest
import torch

from gdn_cp.distributed import DeviceInfo, Platform, PlatformError, init_rank_group, resolve_platform
from gdn_cp.distributed import platform as platform_module
from gdn_cp.distributed import process_group as process_group_module
from gdn_cp.distributed.platform import read_devices


@pytest.fixture(autouse=True)
def no_device_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh process: no set_device yet."""
    monkeypatch.setattr(platform_module, "_chosen", {})


class FakeDeviceModule:
    """The slice of torch.cuda / torch.npu that Platform uses."""

    def __init__(self, available: bool = True) -> None:
        self.available = available
        self.calls: list[tuple] = []

    def is_available(self) -> bool:
        return self.available

    def __getattr__(self, name: str):
        results = {
            "device_count": 8,
            "mem_get_info": (3 * 2**30, 64 * 2**30),
            "max_memory_allocated": 123,
            "memory_allocated": 7,
            "get_device_name": "Ascend910B",
        }

        def call(*args):
            self.calls.append((name, *args))
            return results.get(name)

        return call


def test_auto_is_cpu_with_gloo_without_an_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45: true on a GPU host too (the tests run there): auto is cuda there, cpu without a GPU."""
    if torch.cuda.is_available():
        assert resolve_platform("auto").device_type in ("cuda", "npu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    platform = resolve_platform("auto")
    assert (platform.device_type, platform.backend) == ("cpu", "gloo")
    assert platform.device_count() is None and platform.memory_info(0) is None
    assert not platform.has_allocator_stats
    with pytest.raises(PlatformError, match="profiler meter"):
        platform.max_memory_allocated()


def test_unknown_device_lists_the_choices() -> None:
    with pytest.raises(PlatformError, match="device must be one of auto, cpu, cuda, npu; got 'tpu'"):
        resolve_platform("tpu")


def test_npu_without_torch_npu_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu -> ImportError
    with pytest.raises(PlatformError, match=r"needs torch-npu: install it with `pip install -e '.\[npu\]'`"):
        resolve_platform("npu")


def test_cuda_without_a_gpu_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a host without a GPU, wherever it runs
    with pytest.raises(PlatformError, match=r"no GPU visible to torch .* or choose --device cpu"):
        resolve_platform("cuda")


def test_npu_path_uses_torch_npu_and_hccl(monkeypatch: pytest.MonkeyPatch) -> None:
    npu = FakeDeviceModule()
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    platform = resolve_platform("auto")
    assert (platform.device_type, platform.backend) == ("npu", "hccl")
    platform.set_device(3)
    platform.synchronize()
    platform.reset_peak_memory()
    assert platform.max_memory_allocated() == 123
    assert platform.memory_info(3) == (3 * 2**30, 64 * 2**30)
    assert platform.device_count() == 8
    assert platform.device_name(3) == "Ascend910B"
    assert [c[0] for c in npu.calls] == [
        "set_device",
        "synchronize",
        "reset_peak_memory_stats",
        "max_memory_allocated",
        "mem_get_info",
        "device_count",
        "get_device_name",
    ]


def test_npu_present_but_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", FakeDeviceModule(available=False), raising=False)
    with pytest.raises(PlatformError, match="sees no NPU"):
        resolve_platform("npu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # nor a GPU (the tests run on GPU hosts)
    assert resolve_platform("auto").device_type == "cpu"


def test_cuda_path_uses_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeDeviceModule()
    monkeypatch.setattr(torch, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    platform = resolve_platform("auto")
    assert (platform.device_type, platform.backend) == ("cuda", "nccl")
    platform.set_device(0)
    assert platform.memory_info(0) == (3 * 2**30, 64 * 2**30)
    assert ("mem_get_info", 0) in cuda.calls


@pytest.mark.parametrize("query", ["memory_info", "device_name"])
def test_a_device_is_never_queried_before_set_device_chose_it(monkeypatch, query) -> None:
    """Issue 20: a query of a device this process did not choose would create a context on it (a launcher
    asking device 0 held a context on every node's GPU 0): refused, naming what to do instead."""
    cuda = FakeDeviceModule()
    monkeypatch.setattr(torch, "cuda", cuda)
    platform = Platform("cuda", "nccl")
    with pytest.raises(PlatformError, match=r"cuda:2 asked before set_device chose it in this process"):
        getattr(platform, query)(2)
    with pytest.raises(PlatformError, match="asked before set_device"):
        platform.synchronize()
    assert cuda.calls == []  # refused before reaching the device
    platform.set_device(1)
    with pytest.raises(PlatformError, match=r"cuda:2 asked before set_device"):
        getattr(platform, query)(2)  # another device than the chosen one
    getattr(platform, query)(1)
    assert [c[0] for c in cuda.calls] == [
        "set_device",
        {"memory_info": "mem_get_info"}.get(query, "get_device_name"),
    ]


def test_read_devices_chooses_each_device_before_it_asks_it(monkeypatch) -> None:
    cuda = FakeDeviceModule()
    monkeypatch.setattr(torch, "cuda", cuda)
    devices = read_devices(Platform("cuda", "nccl"))
    assert devices == tuple(DeviceInfo(i, "Ascend910B", 3 * 2**30, 64 * 2**30) for i in range(8))
    calls = [c for c in cuda.calls if c[0] != "device_count"]
    for i in range(8):
        assert calls[3 * i : 3 * i + 3] == [("set_device", i), ("mem_get_info", i), ("get_device_name", i)]


def test_init_rank_group_sets_the_device_then_binds_the_group_to_it(monkeypatch) -> None:
    """Issue 20: set_device(LOCAL_RANK) before init_process_group, and device_id given on an accelerator
    (NCCL binds the communicator at once instead of guessing the device at the first collective)."""
    cuda, seen = FakeDeviceModule(), []
    monkeypatch.setattr(torch, "cuda", cuda)
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setattr(
        process_group_module.dist,
        "init_process_group",
        lambda backend, **kw: seen.append((list(cuda.calls), backend, kw)),
    )
    timeout = datetime.timedelta(seconds=7)
    init_rank_group(Platform("cuda", "nccl"), timeout, world_size=16)
    ((calls_before, backend, kwargs),) = seen
    assert calls_before == [("set_device", 5)] and backend == "nccl"
    assert kwargs == {"timeout": timeout, "device_id": torch.device("cuda", 5), "world_size": 16}
    seen.clear()
    init_rank_group(Platform("cpu", "gloo"), timeout)
    assert seen[0][2] == {"timeout": timeout, "device_id": None}  # gloo: no device to bind
