"""gdn_cp.distributed.platform: device choice, backends, and clear errors where hardware is missing.

No accelerator exists here, so the npu and cuda paths run against stand-ins for torch.cuda and torch_npu
that record which of their documented functions were called.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from gdn_cp.distributed import PlatformError, resolve_platform


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


def test_auto_is_cpu_with_gloo_here() -> None:
    platform = resolve_platform("auto")
    assert (platform.device_type, platform.backend) == ("cpu", "gloo")
    assert platform.device_count() is None and platform.memory_info() is None
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


def test_cuda_without_a_gpu_says_what_to_do() -> None:
    assert not torch.cuda.is_available()
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
    assert platform.device_name(0) == "Ascend910B"
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
    assert resolve_platform("auto").device_type == "cpu"


def test_cuda_path_uses_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeDeviceModule()
    monkeypatch.setattr(torch, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    platform = resolve_platform("auto")
    assert (platform.device_type, platform.backend) == ("cuda", "nccl")
    assert platform.memory_info() == (3 * 2**30, 64 * 2**30)
    assert ("mem_get_info", 0) in cuda.calls
