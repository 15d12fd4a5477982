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
verdicts. A window shorter than MIN_WINDOW_S is too short for the ticks on its own: a sweep judges such a
case over its window plus those of the case-rounds just before it (`with_earlier`; the first case of a run
has the idle `probe` before it), so that no short case passes for clean while another process burns the
cores. None where /proc/stat is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
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


@dataclass(frozen=True, slots=True)
class Window:
    """One host's CPU seconds over a measuring window: all its CPUs' busy time, the part the case's own
    ranks used, the hypervisor's steal, and all its CPUs' time (busy, idle and stolen)."""

    busy_s: float
    own_s: float
    steal_s: float
    total_s: float

    @classmethod
    def between(cls, before: Ticks, after: Ticks, own_s: float) -> Window:
        """The window from two readings of /proc/stat, the case's ranks having used `own_s` CPU-seconds."""
        return cls(
            busy_s=after.busy - before.busy,
            own_s=own_s,
            steal_s=after.steal - before.steal,
            total_s=after.total - before.total,
        )

    def __add__(self, other: Window) -> Window:
        return Window(
            busy_s=self.busy_s + other.busy_s,
            own_s=self.own_s + other.own_s,
            steal_s=self.steal_s + other.steal_s,
            total_s=self.total_s + other.total_s,
        )

    @property
    def long_enough(self) -> bool:
        """Long enough for /proc/stat's ticks (MIN_WINDOW_S of wall time on every CPU)."""
        return self.total_s >= MIN_WINDOW_S * (os.cpu_count() or 1)

    @property
    def foreign(self) -> float:
        """The share of the host's CPU time that other processes used."""
        return max(0.0, self.busy_s - self.own_s) / self.total_s if self.total_s > 0 else 0.0

    @property
    def steal(self) -> float:
        return self.steal_s / self.total_s if self.total_s > 0 else 0.0


def probe(seconds: float = MIN_WINDOW_S) -> Window | None:
    """This host's window over `seconds` of this process waiting: what other processes do while nothing of
    the case runs (the window before a sweep's first case). None without /proc/stat."""
    before, cpu_before = cpu_ticks(), time.process_time()
    time.sleep(seconds)
    after = cpu_ticks()
    if before is None or after is None:
        return None
    return Window.between(before, after, time.process_time() - cpu_before)


def busy(window: Window | None) -> str | None:
    """Why the machine is too busy to time on in `window` (an idle moment of this process), in words, or
    None when it is idle (or /proc/stat is missing): over FOREIGN_CEILING of the CPU taken by others, or
    over STEAL_CEILING stolen by the hypervisor, the ceilings that flag a case as contended."""
    if window is None or (window.foreign <= FOREIGN_CEILING and window.steal <= STEAL_CEILING):
        return None
    return f"others took {window.foreign:.0%} of the CPU, steal {window.steal:.0%}"


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
    window: Window | None = None
    """The worst host's own window (None where it was not kept)."""
    earlier: int = 0
    """How many windows just before this one foreign and steal are also over (`with_earlier`: 0 when the
    case's own window was long enough)."""

    @property
    def reason(self) -> str | None:
        """Why the case counts as contended, or None."""
        windows = "the window" if self.earlier == 1 else f"the {self.earlier} windows"
        over = f" (over this case and {windows} before it)" if self.earlier else ""
        if self.foreign is not None and self.foreign > FOREIGN_CEILING:
            return f"other processes used {self.foreign:.0%} of the CPUs > {FOREIGN_CEILING:.0%}{over}"
        if self.steal is not None and self.steal > STEAL_CEILING:
            return f"steal {self.steal:.1%} > {STEAL_CEILING:.0%}{over}"
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
    over its total (the first rank on each host reads the host's /proc/stat); the worst host counts. The
    shares are None when every host's window is too short (`with_earlier` can still judge it)."""
    windows = []
    for host in dict.fromkeys(r.host for r in readings):
        mine = [r for r in readings if r.host == host]
        before, after = mine[0].before, mine[0].after
        if before is None or after is None:
            continue
        windows.append(Window.between(before, after, sum(r.cpu_s for r in mine)))
    if not windows:
        return Contention(None, None, load_before, load_after, pinned)
    worst = max(windows, key=lambda w: (w.long_enough, w.foreign, w.steal))
    judged = [w for w in windows if w.long_enough]
    return Contention(
        max((w.foreign for w in judged), default=None),
        max((w.steal for w in judged), default=None),
        load_before,
        load_after,
        pinned,
        window=worst,
    )


def with_earlier(contention: Contention, earlier: Sequence[Window]) -> Contention:
    """`contention` judged over its own window plus as many of the windows just before it (the latest
    first) as make the whole long enough for the ticks: a case too short to be judged alone gets the
    figures of the moments around it, which another busy process fills as well. Unchanged when its own window
    is long enough, unknown, or still too short with every earlier one."""
    window = contention.window
    if window is None or window.long_enough:
        return contention
    for n, previous in enumerate(reversed(earlier), start=1):
        window = window + previous
        if window.long_enough:
            return dataclasses.replace(contention, foreign=window.foreign, steal=window.steal, earlier=n)
    return contention


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
