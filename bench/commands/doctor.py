"""`bench doctor [--device auto|cpu|cuda|npu]`: check a host before a long sweep, in minutes, offline, on the
host's own torch: devices and their memory, the backend and one collective of each kind on every local
device, the matmul limit per dtype, the op against its reference on the device, one layer under each mode
at cp = the local devices, and what makes timings vary (governor, boost, other processes, steal). Prints a
verdict table, then each problem in one line. Exit 0 when nothing failed (warnings included), 2 when a check
failed, 1 for a user error.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.commands import common_args
from bench.console import console as default_console
from bench.doctor.checks import SEVERITY, Check, worst
from bench.doctor.rank import doctor_on_rank
from bench.doctor.system import system_checks
from bench.launch.estimate import human_bytes
from gdn_cp.distributed import RankFailure, probe_devices, resolve_platform, run_on_ranks

NAME = "doctor"
HELP = "Check this host before a sweep: devices, backend and collectives, matmul limits, the op, each mode."
EXIT_FAILED = 2
"""A check failed: results on this host would be wrong, or a sweep cannot run."""
CPU_RANKS = 2
"""Ranks of the device checks on cpu (enough for every collective and mode to cross a rank)."""
STYLES = {"ok": "green", "info": "dim", "warn": "yellow", "fail": "bold red"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_args.add_device(parser)
    parser.add_argument(
        "--timeout",
        type=common_args.positive_number,
        default=300.0,
        help="seconds the device checks may take",
    )


def main(args: argparse.Namespace) -> int:
    return run(device=args.device or "auto", timeout_s=args.timeout)


def device_checks(device: str, timeout_s: float) -> tuple[list[Check], int]:
    """The devices' checks, the worst rank's per check, and the number of ranks they ran on."""
    platform = resolve_platform(device)
    checks: list[Check] = []
    if platform.device_type == "cpu":
        world = CPU_RANKS
    else:
        devices = probe_devices(platform)
        world = len(devices)
        for d in devices:
            checks.append(
                Check(
                    "devices",
                    f"{platform.device_type}:{d.index}",
                    "ok",
                    f"{d.name}, {human_bytes(d.free_bytes)} free of {human_bytes(d.total_bytes)}",
                )
            )
        if world == 0:
            return [Check("devices", platform.device_type, "fail", "no device visible")], 0
    try:
        per_rank = run_on_ranks(
            doctor_on_rank, world, (platform.device_type,), device=device, timeout_s=timeout_s
        )
    except RankFailure as exc:
        return [*checks, Check("backend", "ranks", "fail", str(exc).splitlines()[0])], world
    for at, first in enumerate(per_rank[0]):
        same = [ranks[at] for ranks in per_rank]
        chosen = max(same, key=lambda c: SEVERITY[c.status])
        if chosen is not first:
            rank = same.index(chosen)
            chosen = Check(chosen.group, chosen.name, chosen.status, f"rank {rank}: {chosen.detail}")
        checks.append(chosen)
    return checks, world


def run(*, device: str = "auto", timeout_s: float = 300.0, console: Console | None = None) -> int:
    """Every check, the verdict table and the problems; returns the exit code (module docstring)."""
    console = console or default_console
    start = time.perf_counter()
    checks = system_checks()
    found, world = device_checks(device, timeout_s)
    checks += found
    table = Table(title=f"bench doctor: {resolve_platform(device).device_type}, {world} ranks")
    for header in ("group", "check", "status", "detail"):
        table.add_column(header, overflow="fold")
    for c in checks:
        table.add_row(c.group, escape(c.name), f"[{STYLES[c.status]}]{c.status}[/]", escape(c.detail))
    console.print(table)
    problems = [c for c in checks if c.status in ("warn", "fail")]
    for c in problems:
        console.print(
            f"[{STYLES[c.status]}]{c.status}[/]: {escape(c.group)} / {escape(c.name)}: {escape(c.detail)}"
        )
    verdict = worst(checks)
    counts = ", ".join(f"{sum(c.status == s for c in checks)} {s}" for s in ("ok", "warn", "fail"))
    console.print(f"verdict: {verdict} ({counts}) in {time.perf_counter() - start:.0f} s")
    return EXIT_FAILED if verdict == "fail" else 0
