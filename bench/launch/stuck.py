"""Which rank of a case that ran past its wall-clock limit is stuck, and where (bench.launch.pool).

A rank that stops outside a collective (SIGSTOP, a debugger, an endless loop, a sleep) leaves the others
waiting inside one, so "who did not answer" names every rank. What tells them apart:
- the process state in /proc/<pid>/stat: T or t is stopped (SIGSTOP, SIGTSTP or a tracer); it runs no
  code, so nothing else can be asked of it;
- for a process that runs, its Python stack: each pool rank registers faulthandler on SIGUSR1 (writing every
  thread's traceback to its own file), and the main thread's innermost frames say whether it waits in
  torch.distributed (a collective: a peer's victim) or is somewhere else (the stuck one).
The stuck ranks are those not waiting in a collective; when every rank waits in one (collectives that do
not match), all are reported.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DUMP_SIGNAL = signal.SIGUSR1
"""The signal a pool rank dumps its Python stacks on (faulthandler.register in bench.launch.pool_rank)."""
DUMP_WAIT_S = 1.0
"""How long to wait for a running rank's stack dump."""
COLLECTIVE_PATH = f"torch{os.sep}distributed{os.sep}"
"""Frames from files under this path are torch.distributed: a rank there waits for its peers."""
INNER_FRAMES = 4
"""How many innermost frames are searched for torch.distributed (its wrappers add a few)."""

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


@dataclass(frozen=True, slots=True)
class RankState:
    """What a rank that did not answer was doing."""

    rank: int
    stopped: bool
    """Its process is stopped (state T or t): it runs no code."""
    in_collective: bool
    """Its main thread waits in torch.distributed."""
    where: str | None
    """Its main thread's innermost frame, `file:line in func` (None: stopped, or no dump came)."""

    def describe(self) -> str:
        if self.stopped:
            return "is stopped (process state T: SIGSTOP, SIGTSTP or a debugger)"
        if self.in_collective:
            return f"waits in a collective ({self.where})"
        if self.where is not None:
            return f"is busy outside any collective, at {self.where}"
        return "does not answer (no stack dump came)"


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (/proc/<pid>/stat: R, S, D, T, t, Z, ...); None if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ...": comm may hold spaces and parentheses, so split at the last ')'
    rest = text.rsplit(")", 1)[-1].split()
    return rest[0] if rest else None


def main_thread_frames(dump: str, thread_id: int) -> list[tuple[str, int, str]]:
    """(file, line, function) of thread `thread_id`'s frames, innermost first, from the last faulthandler
    dump in `dump` (blocks headed `Thread 0x...` or `Current thread 0x...`)."""
    header = re.compile(rf"^(Current thread|Thread) 0x0*{thread_id:x} ", re.MULTILINE)
    starts = [m.end() for m in header.finditer(dump)]
    if not starts:
        return []
    block = dump[starts[-1] :].split("\n\n", 1)[0]
    return [(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(block)]


def inspect_ranks(
    pids: dict[int, int], thread_ids: dict[int, int], dumps: dict[int, Path]
) -> list[RankState]:
    """The state of each rank in `pids` (rank -> pid), asking the running ones for a stack dump (their
    main thread ids and dump files by rank)."""
    states: dict[int, RankState] = {}
    asked: dict[int, int] = {}
    for rank, pid in pids.items():
        if process_state(pid) in ("T", "t"):
            states[rank] = RankState(rank=rank, stopped=True, in_collective=False, where=None)
            continue
        asked[rank] = dumps[rank].stat().st_size if dumps[rank].exists() else 0
        try:
            os.kill(pid, DUMP_SIGNAL)
        except OSError:
            asked.pop(rank)
            states[rank] = RankState(rank=rank, stopped=False, in_collective=False, where=None)
    deadline = time.monotonic() + DUMP_WAIT_S
    while asked and time.monotonic() < deadline:
        for rank, size in list(asked.items()):
            if dumps[rank].exists() and dumps[rank].stat().st_size > size:
                asked.pop(rank)
        time.sleep(0.05)
    time.sleep(0.05)  # let a dump that has begun finish (faulthandler writes it in a few calls)
    for rank in pids:
        if rank in states:
            continue
        text = dumps[rank].read_text(errors="replace") if dumps[rank].exists() else ""
        frames = main_thread_frames(text, thread_ids.get(rank, -1))
        if not frames:
            states[rank] = RankState(rank=rank, stopped=False, in_collective=False, where=None)
            continue
        inner = frames[:INNER_FRAMES]
        in_collective = any(COLLECTIVE_PATH in f for f, _, _ in inner)
        file, line, func = frames[0]
        states[rank] = RankState(
            rank=rank, stopped=False, in_collective=in_collective, where=f"{file}:{line} in {func}"
        )
    return [states[r] for r in sorted(states)]


def stuck_ranks(states: Sequence[RankState]) -> list[RankState]:
    """The ranks to blame: those not waiting in a collective, else all of them."""
    stuck = [s for s in states if not s.in_collective]
    return stuck or list(states)
