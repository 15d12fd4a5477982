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

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.commands import common_args
from bench.console import COLUMN_OVERHEAD
from bench.console import console as default_console
from bench.doctor.checks import SEVERITY, Check, worst
from bench.doctor.rank import doctor_on_rank
from bench.doctor.system import system_checks
from bench.launch.devices import probe_devices
from bench.launch.estimate import human_bytes
from bench.launch.local import RankFailure, run_on_ranks
from gdn_cp.distributed import resolve_platform

NAME = "doctor"
HELP = "Check this host before a sweep: devices, backend and collectives, matmul limits, the op, each mode."
EXIT_FAILED = 2
"""A check failed: results on this host would be wrong, or a sweep cannot run."""
CPU_RANKS = 2
"""Ranks of the device checks on cpu (enough for every collective and mode to cross a rank)."""
STYLES = {"ok": "green", "info": "dim", "warn": "yellow", "fail": "bold red"}
HEADERS = ("group", "check", "status", "detail")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_args.add_device(parser)
    common_args.add_backend_modules(parser)
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
            doctor_on_rank, world, (platform.device_type, timeout_s), device=device, timeout_s=timeout_s
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


def _widths(checks: list[Check], width: int) -> list[int | None]:
    """The columns' widths (None: natural) where the table would not fit `width`: cells wrap at spaces, and
    every column is at least as wide as its longest word (an op's dotted name in a detail is never cut),
    the detail taking what the others leave; rich folds a word only where even that does not fit."""
    cells = [[c.group, c.name, c.status, c.detail] for c in checks]
    headers = HEADERS
    natural = [max(cell_len(x) for x in [h, *(row[i] for row in cells)]) for i, h in enumerate(headers)]
    words = [
        max(cell_len(w) for x in [h, *(row[i] for row in cells)] for w in x.split() or [""])
        for i, h in enumerate(headers)
    ]
    room = width - 1 - COLUMN_OVERHEAD * len(headers)
    if sum(natural) <= room:
        return [None] * len(headers)
    group, status = natural[0], natural[2]
    left = room - group - status
    detail = max(words[3], min(natural[3], left - natural[1]))
    check = max(words[1], left - detail)
    return [group, check, status, max(1, room - group - status - check)]


def run(*, device: str = "auto", timeout_s: float = 300.0, console: Console | None = None) -> int:
    """Every check, the verdict table and the problems; returns the exit code (module docstring)."""
    console = console or default_console
    start = time.perf_counter()
    checks = system_checks()
    found, world = device_checks(device, timeout_s)
    checks += found
    table = Table(title=f"bench doctor: {resolve_platform(device).device_type}, {world} ranks")
    for header, width in zip(HEADERS, _widths(checks, console.width), strict=True):
        table.add_column(header, overflow="fold", width=width)
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
