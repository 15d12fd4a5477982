"""The host's part of `bench doctor`, read as pyperf's `system show` reads it: what makes timings vary from
one run to the next (CPU frequency scaling, boost, other processes, steal), and what the sweep runs on."""

from __future__ import annotations

import contextlib
import os
import platform as _host
from pathlib import Path

import torch

from bench.doctor.checks import Check
from bench.launch.estimate import host_available_bytes, human_bytes
from bench.measure.contention import busy, load_average, probe
from bench.results.env import cpu_model, torch_npu_version

SYS_CPU = Path("/sys/devices/system/cpu")
PROBE_S = 1.0
"""How long the idle probe watches what other processes do."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def software() -> list[Check]:
    """torch and its device builds: facts for the report."""
    cuda = torch.version.cuda or "none"
    nccl = "none"
    if torch.cuda.is_available() or torch.version.cuda:
        with contextlib.suppress(RuntimeError, AttributeError):
            nccl = ".".join(map(str, torch.cuda.nccl.version()))  # a library query: no device context
    npu = torch_npu_version() or "none"
    return [
        Check(
            "system",
            "software",
            "info",
            f"python {_host.python_version()}, torch {torch.__version__} (CUDA {cuda}, NCCL {nccl}), "
            f"torch-npu {npu}",
        )
    ]


def cpu() -> list[Check]:
    """The CPU, its frequency policy and boost: a governor other than performance, or boost on, lets the
    clock follow the load, so that two runs of one case differ by what the CPU chose."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    out = [Check("system", "cpu", "info", f"{cpu_model()}, {cores} cores usable of {os.cpu_count() or 1}")]
    governors = {_read(p) for p in SYS_CPU.glob("cpu[0-9]*/cpufreq/scaling_governor")} - {None}
    if not governors:
        out.append(Check("system", "cpu governor", "info", "not exposed (a VM, or no cpufreq driver)"))
    elif governors == {"performance"}:
        out.append(Check("system", "cpu governor", "ok", "performance on every core"))
    else:
        out.append(
            Check(
                "system",
                "cpu governor",
                "warn",
                f"{', '.join(sorted(governors))}: the clock follows the load; set `performance` "
                "(cpupower frequency-set -g performance) for stable timings",
            )
        )
    no_turbo, boost = _read(SYS_CPU / "intel_pstate" / "no_turbo"), _read(SYS_CPU / "cpufreq" / "boost")
    if no_turbo == "0" or boost == "1":
        out.append(
            Check(
                "system",
                "boost",
                "warn",
                "turbo boost on: the clock depends on temperature and load; "
                "turn it off for stable timings (intel_pstate/no_turbo = 1, or cpufreq/boost = 0)",
            )
        )
    elif no_turbo == "1" or boost == "0":
        out.append(Check("system", "boost", "ok", "off"))
    isolated = _read(SYS_CPU / "isolated")
    out.append(
        Check(
            "system",
            "isolated cpus",
            "info",
            f"{isolated} (isolcpus)" if isolated else "none (isolcpus unset)",
        )
    )
    return out


def load() -> list[Check]:
    """What other processes do: the share of the CPU they took over PROBE_S of idling here, the
    hypervisor's steal, the load average; over the ceilings bench run flags a case as contended."""
    window = probe(PROBE_S)
    avg = load_average()
    cores = os.cpu_count() or 1
    if window is None:
        return [Check("system", "load", "info", f"load average {avg}; no /proc/stat to measure others")]
    figures = (
        f"others took {window.foreign:.0%} of the CPU, steal {window.steal:.0%}, load {avg:.2f} on "
        f"{cores} cores"
    )
    if busy(window) is not None:
        return [
            Check(
                "system",
                "load",
                "warn",
                f"busy machine: {figures} over {PROBE_S:.0f} s; timings now would be contended (bench run "
                "flags such cases): stop the other work, or run later",
            )
        ]
    return [Check("system", "load", "ok", f"idle: {figures}")]


def memory() -> list[Check]:
    available = host_available_bytes()
    detail = "unknown" if available is None else f"{human_bytes(available)} available"
    return [Check("system", "host memory", "info", detail)]


def system_checks() -> list[Check]:
    return [*software(), *cpu(), *load(), *memory()]
