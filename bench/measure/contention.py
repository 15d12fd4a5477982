"""Whether a case ran on a machine it had to itself: CPU utilisation of the timed passes, CPU steal and load
around them, and the verdict "contended" (issue: a timing taken while another process used the cores is not
a measurement of the code).

- utilisation: per timed pass, the rank process's CPU time (every thread: time.process_time) over wall time x
  its intra-op threads. Idle 2-thread ranks on 2 cores sit near 1 (OpenMP threads spin while they wait);
  when another process takes the cores, the ranks' threads are descheduled and it drops. CPU devices only:
  on an accelerator the host threads mostly wait, so it says nothing there (None).
- steal: the share of the host's CPU time that the hypervisor gave to other guests over the case's timed
  passes (/proc/stat; None where there is no /proc/stat).
- load: the 1-minute load average before and after the timed passes (os.getloadavg).

A case is contended when the lowest rank's median utilisation is under UTILISATION_FLOOR or the steal is
over STEAL_CEILING; `bench compare` keeps contended cases out of its verdicts.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

UTILISATION_FLOOR = 0.8
"""Below this, a rank had less CPU than its threads (another process took some)."""
STEAL_CEILING = 0.05
"""Above this share of CPU time stolen by the hypervisor, the machine was shared."""

PROC_STAT = Path("/proc/stat")


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot, from /proc/stat's `cpu` line; None without one."""
    try:
        line = PROC_STAT.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = [int(f) for f in line.split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is inside user already.
    steal = fields[7] if len(fields) > 7 else 0
    return steal, sum(fields[:8])


def steal_between(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen between two `cpu_ticks` readings (None if either is missing)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def utilisation(cpu_s: float, wall_s: float, threads: int) -> float:
    """CPU seconds used over the seconds `threads` threads could have used."""
    return cpu_s / max(wall_s * threads, 1e-12)


@dataclass(frozen=True, slots=True)
class Contention:
    """How shared the machine was while a case was timed (module docstring)."""

    utilisation: float | None
    """The lowest rank's median over the timed passes of CPU time / (wall x threads); None off CPU."""
    steal: float | None
    """The share of CPU time stolen over the timed passes; None where unknown."""
    load_before: float | None
    load_after: float | None
    """1-minute load average just before and just after the timed passes."""
    pinned: bool = False
    """Each rank's threads were pinned to cores of their own."""

    @property
    def reason(self) -> str | None:
        """Why the case counts as contended, or None."""
        if self.utilisation is not None and self.utilisation < UTILISATION_FLOOR:
            return f"utilisation {self.utilisation:.2f} < {UTILISATION_FLOOR}"
        if self.steal is not None and self.steal > STEAL_CEILING:
            return f"steal {self.steal:.1%} > {STEAL_CEILING:.0%}"
        return None

    @property
    def contended(self) -> bool:
        return self.reason is not None


def judge(
    cpu_s: list[list[float]] | None,
    samples_s: list[list[float]],
    threads: int,
    *,
    steal: float | None,
    load_before: float | None,
    load_after: float | None,
    pinned: bool,
) -> Contention:
    """The Contention of a case from every rank's per-pass CPU seconds ([rank][repeat]; None off CPU) and
    elapsed seconds ([rank][repeat])."""
    lowest = None
    if cpu_s is not None:
        lowest = min(
            statistics.median(utilisation(c, w, threads) for c, w in zip(cpus, walls, strict=True))
            for cpus, walls in zip(cpu_s, samples_s, strict=True)
        )
    return Contention(lowest, steal, load_before, load_after, pinned)


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
