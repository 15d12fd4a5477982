"""bench.results.lock: one run at a time on a result file. A held lock names its holder to a second run; a
dead holder's lock is taken over, saying so; a lock of another host is left to the user; releasing removes
the lock file, or empties it where the folder is read-only."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.errors import UserError
from bench.results import lock as lock_module
from bench.results.lock import Holder, ResultLock, lock_path

HOST = socket.gethostname()


def _notes() -> tuple[list[str], object]:
    notes: list[str] = []
    return notes, notes.append


def test_a_second_holder_is_told_who_holds_the_file_until_it_is_released(tmp_path: Path):
    result = tmp_path / "r.json"
    notes, note = _notes()
    first = ResultLock.acquire(result, "bench run tiny --resume r.json", note=note)
    holder = Holder.read(lock_path(result).read_text())
    assert holder is not None and (holder.pid, holder.host) == (os.getpid(), HOST)
    with pytest.raises(UserError) as info:  # an flock of another open file conflicts, in this process too
        ResultLock.acquire(result, "bench run tiny --resume r.json", note=note)
    message = str(info.value)
    assert message.startswith(f"{result}: another bench run is writing it: pid {os.getpid()} on {HOST} ")
    assert "(bench run tiny --resume r.json); wait for that run to end" in message
    first.release()
    assert not lock_path(result).exists()
    with ResultLock.acquire(result, "bench run tiny", note=note):
        assert lock_path(result).exists()
    assert not lock_path(result).exists() and notes == []


def test_a_lock_held_by_another_process_names_it(tmp_path: Path):
    result = tmp_path / "r.json"
    holder = textwrap.dedent(
        f"""
        import sys
        from bench.results.lock import ResultLock
        held = ResultLock.acquire({str(result)!r}, "bench run other", note=print)
        print("held", flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"pid {proc.pid} on {HOST} since .* \(bench run other\)"):
            ResultLock.acquire(result, "bench run mine", note=print)
    finally:
        proc.communicate("", timeout=60)
    # killed or ended, its flock is gone; it cleared its file on release
    with ResultLock.acquire(result, "bench run mine", note=print):
        pass


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    return proc.pid


def _stale(result: Path, pid: int, host: str = HOST) -> None:
    data = {"pid": pid, "host": host, "command": "bench run old", "since": "2026-12-01T10:00:00+00:00"}
    lock_path(result).write_text(json.dumps(data))


def test_a_dead_holders_lock_is_taken_over_saying_so(tmp_path: Path):
    result = tmp_path / "r.json"
    pid = _dead_pid()
    _stale(result, pid)
    notes, note = _notes()
    with ResultLock.acquire(result, "bench run new", note=note):
        assert Holder.read(lock_path(result).read_text()).command == "bench run new"
    assert notes == [
        f"{result}: taking over the lock of pid {pid} on {HOST} since 2026-12-01T10:00:00+00:00 "
        "(bench run old), which is gone"
    ]


def test_a_stale_lock_of_another_host_is_left_to_the_user(tmp_path: Path):
    result = tmp_path / "r.json"
    _stale(result, 4242, host="elsewhere")
    with pytest.raises(UserError) as info:
        ResultLock.acquire(result, "bench run new", note=print)
    assert str(info.value) == (
        f"{result}: its lock names pid 4242 on elsewhere since 2026-12-01T10:00:00+00:00 (bench run old), "
        f"which this host cannot check; if that run has ended, remove {lock_path(result)} and run again"
    )
    assert Holder.read(lock_path(result).read_text()).host == "elsewhere"  # left as it was


def test_releasing_in_a_read_only_folder_leaves_no_holder_behind(tmp_path: Path, monkeypatch):
    result = tmp_path / "r.json"
    held = ResultLock.acquire(result, "bench run", note=print)

    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as m:  # chmod does not stop root, who runs some CI
        m.setattr(Path, "unlink", refused)
        held.release()
    assert lock_path(result).read_text() == ""
    notes, note = _notes()
    with ResultLock.acquire(result, "bench run", note=note):
        pass
    assert notes == []


def test_a_lock_file_removed_while_waiting_for_it_is_not_the_lock(tmp_path: Path):
    """A process that opened the lock file before its holder removed it must not take the removed file's
    flock for the lock (two holders): acquire checks that the file it locked is still the one on disk."""
    result = tmp_path / "r.json"
    held = ResultLock.acquire(result, "bench run", note=print)
    late = os.open(lock_path(result), os.O_RDWR)
    held.release()
    try:
        assert not lock_module._same_file(late, lock_path(result))
        with ResultLock.acquire(result, "bench run", note=print):
            assert not lock_module._same_file(late, lock_path(result))
    finally:
        os.close(late)
