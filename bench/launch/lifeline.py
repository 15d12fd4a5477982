"""The processes of a local launch die with the process that launched them, even a SIGKILLed one.

Local ranks (and the device probe) are forked from multiprocessing's forkserver, which the launcher
starts (bench.launch.local.rank_context), so a rank's parent is that server, not the launcher. Neither
notices the launcher's death on its own: the server exits when its "alive" pipe reports end of file, but
every rank it forked holds that pipe's write end (and so does a fork request still queued on its socket),
and a rank waits in its collective or on its store for as long as its timeout. So the chain is closed link
by link with Linux's parent-death signal (prctl PR_SET_PDEATHSIG: SIGKILL when the parent thread ends):

    launcher --(the server's signal, set as the server imports this module)--> server
    server   --(each child's signal, set right after its fork, os.register_at_fork)--> rank, probe

The server imports this module first of its preload list (before torch: seconds on a loaded machine),
with the launcher's pid in LAUNCHER_PID_ENV; a process forked from it, or from one of its children, arms
itself in the fork's child hook. Each checks its parent after setting the signal: a parent that died just
before (the child already re-parented) would never send it, so the child kills itself then.

The server's signal follows the launcher's thread that started it: `start_server` arms it only from the
main thread (a launch from a thread that ended would take the server and every rank with it). Elsewhere
than Linux nothing is armed: pool ranks still leave when their pipe to the launcher closes.
"""

from __future__ import annotations

import ctypes
import multiprocessing.forkserver
import os
import signal
import sys
import threading

LAUNCHER_PID_ENV = "BENCH_LAUNCHER_PID"
"""Set only while the launcher starts the server: the pid the server checks its parent against. A process
that imports this module without it (the launcher, a rank) arms nothing at import."""
PR_SET_PDEATHSIG = 1
"""prctl option (linux/prctl.h): the signal this process gets when its parent thread ends."""


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()
_forking_pid: int | None = None
"""The pid of the process about to fork (set in the parent's before-fork hook, read by the child's)."""


def die_with_parent(parent: int) -> bool:
    """Have this process SIGKILLed when its parent thread ends; if its parent is no longer `parent` (it
    died before the signal was set, and this process was re-parented), SIGKILL it now. False where the
    signal cannot be set (not Linux)."""
    if _prctl is None or _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def _note_forker() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _arm_child() -> None:
    if _forking_pid is not None:
        die_with_parent(_forking_pid)


def _arm_server() -> None:
    """In the server (LAUNCHER_PID_ENV set): die with the launcher, and have every process forked from here
    on die with the process it was forked from."""
    launcher = os.environ.pop(LAUNCHER_PID_ENV, None)
    if launcher is None or not die_with_parent(int(launcher)):
        return
    os.register_at_fork(before=_note_forker, after_in_child=_arm_child)


def start_server() -> None:
    """Start multiprocessing's forkserver now unless it runs (its preload list set before), armed to die
    with this process when called from the main thread (module docstring)."""
    armed = _prctl is not None and threading.current_thread() is threading.main_thread()
    if armed:
        os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if armed:
            os.environ.pop(LAUNCHER_PID_ENV, None)


_arm_server()
