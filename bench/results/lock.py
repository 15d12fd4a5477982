"""One `bench run` at a time on a result file: an advisory lock beside it.

    with ResultLock.acquire(path, command, note=print):   # UserError when another run holds it
        ...                                                 # measure and write `path`

The lock is an flock(2) on a sidecar file, `.<name>.lock` in the result file's folder (the result file itself
is replaced atomically on every write, so it cannot hold a lock). The holder writes its pid, host, command
line and start time into it, so that a second run can say who holds the file; the kernel drops an flock when
its process dies, whatever kills it. A lock file that still names a holder once the flock is free is stale
(its process was killed before it could clear it): on this host it is taken over with a note (that process
is gone, or its pid is now another process's). One that names another host is refused: a network file
system may keep flocks to each host, so this host cannot tell whether that run still writes; the message
says which file to remove once it has ended.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.errors import UserError
from bench.results.env import now_iso

ATTEMPTS = 5
"""Tries to lock the sidecar when its holder removes it meanwhile (each try locks the file then on disk)."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a result file's lock, as its lock file says."""

    pid: int
    host: str
    command: str
    since: str
    """When it took the lock, ISO 8601."""

    def describe(self) -> str:
        """`pid 4242 on node1 since 2026-12-01T10:00:00+00:00 (bench run cpu-smoke)`."""
        return f"pid {self.pid} on {self.host} since {self.since} ({self.command})"

    @classmethod
    def read(cls, text: str) -> Holder | None:
        """The holder a lock file's text names; None for an empty or unreadable one."""
        try:
            data = json.loads(text)
            return cls(int(data["pid"]), str(data["host"]), str(data["command"]), str(data["since"]))
        except (ValueError, KeyError, TypeError):
            return None


def lock_path(result: Path) -> Path:
    """The sidecar lock file of a result file: `.<name>.lock` beside it."""
    return result.with_name(f".{result.name}.lock")


def alive(pid: int) -> bool:
    """Whether a process of this id runs on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ResultLock:
    """A held lock on a result file (`acquire`); `release` clears and removes its lock file."""

    def __init__(self, result: Path, fd: int) -> None:
        self.result = result
        self.path = lock_path(result)
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, result: str | Path, command: str, *, note: Callable[[str], None]) -> ResultLock:
        """Lock `result` for this process, `command` being what it runs (for the message of a second run).
        UserError, naming the holder, when another process holds it, when a stale lock names another host,
        or when the lock file cannot be made; `note` says when a dead holder's lock is taken over."""
        result = Path(result)
        path = lock_path(result)
        for _ in range(ATTEMPTS):
            fd = _open(path, result)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = Holder.read(_read(fd))
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise UserError(
                        f"{result}: cannot lock it ({exc.strerror}, {path}); its folder must allow locks "
                        "for a run to write there"
                    ) from None
                who = holder.describe() if holder is not None else "another process (starting)"
                raise UserError(
                    f"{result}: another bench run is writing it: {who}; wait for that run to end (or stop "
                    "it), then resume the file"
                ) from None
            if _same_file(fd, path):
                break
            os.close(fd)  # its holder removed that file while this process waited for it: lock the new one
        else:
            raise UserError(f"{result}: its lock file {path} keeps changing; try again")
        lock = cls(result, fd)
        try:
            lock._claim(command, note)
        except BaseException:
            lock._fd = None
            os.close(fd)  # unlocked, its file left as it was (a holder of another host named in it)
            raise
        return lock

    def _claim(self, command: str, note: Callable[[str], None]) -> None:
        """Take over what the lock file names (a holder killed before it could clear it), then name this
        process in it."""
        assert self._fd is not None
        stale = Holder.read(_read(self._fd))
        if stale is not None and stale.pid != os.getpid():
            if stale.host != socket.gethostname():
                raise UserError(
                    f"{self.result}: its lock names {stale.describe()}, which this host cannot check; if "
                    f"that run has ended, remove {self.path} and run again"
                )
            why = "is gone" if not alive(stale.pid) else "no longer holds it"
            note(f"{self.result}: taking over the lock of {stale.describe()}, which {why}")
        me = Holder(os.getpid(), socket.gethostname(), command, now_iso())
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (json.dumps(asdict(me)) + "\n").encode(), 0)

    def release(self) -> None:
        """Remove the lock file (while still holding it, so that no one locks the removed file meanwhile:
        `acquire` checks that the file it locked is still there), then unlock. In a folder turned read-only
        the file is emptied instead, so that the next run finds no holder in it."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink()
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
        os.close(fd)

    def __enter__(self) -> ResultLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _open(path: Path, result: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise UserError(
            f"{result}: cannot create its lock file {path.name} ({exc.strerror}); a run writes its results "
            "in that folder, so it must be writable"
        ) from None


def _read(fd: int) -> str:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return os.pread(fd, 4096, 0).decode()
    return ""


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd` (a releasing holder removes it)."""
    try:
        on_disk = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (on_disk.st_dev, on_disk.st_ino)
