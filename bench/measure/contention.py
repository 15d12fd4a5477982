"""Whether a case ran on a machine it had to itself: the CPU time other processes took while it was timed,
CPU steal and load around it, and the verdict "contended" (a timing taken while another process used the
cores is not a measurement of the code).

- foreign: over the rank's measuring window (building the layer, warmup, timed passes: long enough for
  /proc/stat's 10 ms ticks, MIN_WINDOW_S), the host's busy CPU time (/proc/stat: user, nice, system, irq,
  softirq) less what the case's own ranks on that host used (time.process_time: every thread), as a share
  of all the host's CPU time in that window. It does not depend on how well the case's work uses its
  threads (a 3 ms pass on two threads runs mostly on one, which CPU time over wall x threads mistakes for
  contention); it sees every other process that ran.
- steal: the share of the host's CPU time that the hypervisor gave to other guests over the same window.
- load: the 1-minute load average before and after the timed passes (os.getloadavg).
Per-thread run-queue waits (/proc/<pid>/schedstat) would be the direct measure, but kernels without
schedstats report zeros there (this project's CPU machines do).

A case is contended when other processes took more than FOREIGN_CEILING of the CPUs (the ranks had under
~80% of the machine) or the steal is over STEAL_CEILING; `bench compare` keeps contended cases out of its
verdicts. None where /proc/stat is missing or the window is shorter than MIN_WINDOW_S.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MIN_WINDOW_S = 0.5
"""Shorter windows get no foreign share: /proc/stat counts in 10 ms ticks per CPU, a +-2% error at 0.5 s."""
FOREIGN_CEILING = 0.2
"""Above this share of the host's CPU time used by other processes, the case did not have the machine."""
STEAL_CEILING = 0.05
"""Above this share of CPU time stolen by the hypervisor, the machine was shared."""

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class Ticks:
    """Cumulative CPU seconds of all the host's CPUs since boot (/proc/stat's `cpu` line)."""

    busy: float
    steal: float
    total: float


def cpu_ticks() -> Ticks | None:
    """The host's CPU time now; None without /proc/stat."""
    try:
        line = PROC_STAT.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is inside user already.
    f = [int(x) for x in line.split()[1:]] + [0] * 8
    hz = os.sysconf("SC_CLK_TCK")
    return Ticks(busy=(f[0] + f[1] + f[2] + f[5] + f[6]) / hz, steal=f[7] / hz, total=sum(f[:8]) / hz)


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class Contention:
    """How shared the machine was while a case was timed (module docstring)."""

    foreign: float | None
    """The most any host gave other processes: their share of its CPU time over the window; None where
    unknown or the window was too short."""
    steal: float | None
    """The share of CPU time stolen over the window; None where unknown."""
    load_before: float | None
    load_after: float | None
    """1-minute load average at the start and the end of the window."""
    pinned: bool = False
    """Each rank's threads were pinned to cores of their own."""

    @property
    def reason(self) -> str | None:
        """Why the case counts as contended, or None."""
        if self.foreign is not None and self.foreign > FOREIGN_CEILING:
            return f"other processes used {self.foreign:.0%} of the CPUs > {FOREIGN_CEILING:.0%}"
        if self.steal is not None and self.steal > STEAL_CEILING:
            return f"steal {self.steal:.1%} > {STEAL_CEILING:.0%}"
        return None

    @property
    def contended(self) -> bool:
        return self.reason is not None


@dataclass(frozen=True, slots=True)
class RankReading:
    """What one rank read around its timed passes."""

    host: str
    cpu_s: float
    """The rank process's CPU seconds over the window (every thread)."""
    before: Ticks | None
    after: Ticks | None


def judge(
    readings: Sequence[RankReading], *, load_before: float | None, load_after: float | None, pinned: bool
) -> Contention:
    """The Contention of a case from every rank's reading: per host, its busy CPU time less its ranks' own,
    over its total (the first rank on each host reads the host's /proc/stat); the worst host counts."""
    foreign = steal = None
    for host in dict.fromkeys(r.host for r in readings):
        mine = [r for r in readings if r.host == host]
        before, after = mine[0].before, mine[0].after
        if before is None or after is None:
            continue
        total = after.total - before.total
        if total < MIN_WINDOW_S * (os.cpu_count() or 1):
            continue
        others = max(0.0, after.busy - before.busy - sum(r.cpu_s for r in mine)) / total
        stolen = (after.steal - before.steal) / total
        foreign = others if foreign is None else max(foreign, others)
        steal = stolen if steal is None else max(steal, stolen)
    return Contention(foreign, steal, load_before, load_after, pinned)


def pin_threads(rank: int, ranks: int, threads: int) -> bool:
    """Pin this rank's threads to cores [rank * threads, (rank + 1) * threads) of those it may use, when all
    `ranks` x `threads` fit (the same answer on every rank of a host); True if pinned. Threads started later
    inherit the main thread's cores."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
        tasks = [int(t.name) for t in Path("/proc/self/task").iterdir()]
    except (AttributeError, OSError):  # no affinity API (macOS) or no /proc
        return False
    if ranks * threads > len(allowed):
        return False
    mine = allowed[rank * threads : (rank + 1) * threads]
    for task in tasks:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(task, mine)
    return True
