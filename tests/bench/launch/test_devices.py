"""bench.launch.devices: the launcher reads the host's accelerators in a child process, never itself."""

from __future__ import annotations

import pytest
import torch

from bench.launch import devices
from gdn_cp.distributed import Platform, PlatformError
from gdn_cp.distributed import platform as platform_module


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without a GPU, where the probe fails")
def test_the_probe_runs_in_a_child_and_fails_with_one_line(monkeypatch) -> None:
    """probe_devices reads the devices in a process of its own; here no GPU exists, so the child fails and
    the launcher gets one PlatformError saying what to check (and this process chose no device)."""
    monkeypatch.setattr(platform_module, "_chosen", {})
    monkeypatch.setattr(devices, "_probed", {})
    with pytest.raises(PlatformError, match=r"reading this host's cuda devices failed .* `bench doctor`"):
        devices.probe_devices(Platform("cuda", "nccl"))
    assert platform_module._chosen == {}
    assert devices.probe_devices(Platform("cpu", "gloo")) == ()
