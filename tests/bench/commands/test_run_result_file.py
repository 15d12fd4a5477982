"""`bench run` and its result file (issue 50): one run at a time on a file, so that no case-round is measured
twice (real `bench run --resume` processes); a dead run's lock is taken over, saying so; a results folder
turned read-only mid-run is one line, and the resume completes once it is writable again."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from bench.cli import main
from bench.commands import run as run_command
from bench.results import store
from bench.results.lock import lock_path
from bench.results.store import load_result
from tests.bench.results.read_only import read_only

pytestmark = pytest.mark.multirank

RESUME = ["run", "tiny", "--filter", "cp=1", "--set", "rounds=6", "--resume", "f.json"]
"""Two cp 1 cases of 6 rounds: the file below holds their first round, 10 case-rounds are left."""
ROUND_LINE = re.compile(r"\br\d+/6 ")
"""A finished case-round's status line (`r2/6 tiny/...`)."""


def _messages(err: str) -> list[str]:
    """stderr's messages, a wrapped one's continuation lines (indented) joined to it, without the
    busy-machine warning a loaded test machine gets."""
    messages: list[str] = []
    for line in err.splitlines():
        if line.startswith(" ") and messages:
            messages[-1] += " " + line.strip()
        elif line.strip():
            messages.append(line)
    return [m for m in messages if not m.startswith("warning: busy machine")]


@dataclass
class _Bench:
    """A `bench run` in its own process, each stream read by one thread of its own into a list (never also
    by communicate(), which would race the thread for stdout's lines)."""

    proc: subprocess.Popen
    out: list[str]
    err: list[str]
    readers: list[threading.Thread]

    def finish(self, timeout: float) -> str:
        """Wait for the process and its readers; its stderr."""
        self.proc.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=30)
        return "".join(self.err)


def _start(suite_dir: Path) -> _Bench:
    """`bench run` (RESUME) in its own process; its stdout and stderr lines collect as they come."""
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", *RESUME],
        cwd=suite_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True),
        threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    return _Bench(proc, out, err, readers)


def _wait_for(bench: _Bench, prefix: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not any(line.startswith(prefix) for line in bench.out):
        assert bench.proc.poll() is None, f"exited {bench.proc.returncode} before {prefix!r}: {bench.err}"
        assert time.monotonic() < deadline, f"no {prefix!r} in {timeout} s: {bench.out}"
        time.sleep(0.1)


def test_two_resumes_of_one_file_measure_nothing_twice(suite_dir: Path):
    """The first resume holds the file (stopped with SIGSTOP once it has opened it, so that the second
    surely starts while it holds it); the second says who holds it and exits 1 without measuring; the first,
    continued, measures each missing case-round once."""
    assert (
        run_command.run(["tiny"], filters=["cp=1"], sets=["rounds=6"], output="f.json", stop_after_round=1)
        == 0
    )
    first = _start(suite_dir)
    try:
        _wait_for(first, "resuming f.json: 0 of 2 cases done, 2 of 12 case-rounds")
        os.kill(first.proc.pid, signal.SIGSTOP)
        second = _start(suite_dir)
        try:
            second_err = second.finish(timeout=180)
        finally:
            os.kill(first.proc.pid, signal.SIGCONT)
        first_err = first.finish(timeout=300)
    finally:
        for proc in (first.proc, second.proc):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert second.proc.returncode == 1, (second.out, second_err)
    lines = _messages(second_err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in second_err, second_err
    assert lines[0].startswith(
        f"error: f.json: another bench run is writing it: pid {first.proc.pid} on {socket.gethostname()} "
        "since "
    )
    assert (
        "(bench run tiny --set rounds=6 --filter cp=1 --resume f.json); wait for that run to end" in lines[0]
    )
    assert not any(ROUND_LINE.search(line) for line in second.out)  # it measured nothing
    assert first.proc.returncode == 0, first_err
    assert sum(bool(ROUND_LINE.search(line)) for line in first.out) == 10  # every missing case-round once
    run = load_result(suite_dir / "f.json")
    assert [len(c.rounds) for c in run.cases] == [6, 6]
    assert all(len({r.lifetime for r in c.rounds}) == 6 for c in run.cases)  # six rounds, six lifetimes
    assert not lock_path(suite_dir / "f.json").exists()  # released


def test_a_dead_runs_lock_is_taken_over_saying_so(suite_dir: Path, monkeypatch, capsys):
    """A run killed with SIGKILL leaves its lock file naming it (the kernel drops its flock): the next
    resume takes the file over, naming the dead run, and goes on."""
    monkeypatch.setattr(run_command, "_run_with_progress", lambda *args, **kwargs: [])  # no ranks needed
    assert main(["run", "tiny", "--filter", "cp=1", "--output", "f.json"]) == 0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    holder = {"pid": dead.pid, "host": socket.gethostname(), "command": "bench run tiny", "since": "then"}
    lock_path(suite_dir / "f.json").write_text(json.dumps(holder))
    capsys.readouterr()
    console = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    assert run_command.run(["tiny"], filters=["cp=1"], resume="f.json", console=console) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"warning: f.json: taking over the lock of pid {dead.pid} on {socket.gethostname()} since then "
        "(bench run tiny), which is gone" in err
    )
    assert not lock_path(suite_dir / "f.json").exists()


def test_a_results_folder_turned_read_only_mid_run_is_one_line_then_resume_completes(
    suite_dir: Path, monkeypatch, capsys
):
    """After the first case-round is saved the folder turns read-only (chmod; as root, os.open refusing new
    files there with EROFS, at tempfile.mkstemp's own call): one line saying what could not be written,
    what the file holds, and the resume command, exit 1; writable again, that command completes the run."""
    out = suite_dir / "out.json"
    real_save, stack = store.ResultWriter._save, contextlib.ExitStack()

    def save(writer: store.ResultWriter) -> None:
        real_save(writer)
        if writer.saved == 1:
            stack.enter_context(read_only(suite_dir, monkeypatch))

    monkeypatch.setattr(store.ResultWriter, "_save", save)
    with stack:
        code = main(["run", "tiny", "--filter", "cp=1", "--output", str(out)])
        err = capsys.readouterr().err
    assert code == 1, err
    lines = [line for line in err.splitlines() if not line.startswith("warning: busy machine")]
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert (
        line.startswith(f"error: cannot write {out}: ")
        and "the run stopped; out.json holds the 1 case" in line
    )
    assert line.endswith(
        "make its folder writable again, then continue with `bench run tiny --filter cp=1 --resume out.json`"
    )
    assert len(load_result(out).cases) == 1  # what was saved is safe
    monkeypatch.setattr(store.ResultWriter, "_save", real_save)
    assert main(["run", "tiny", "--filter", "cp=1", "--resume", str(out)]) == 0
    assert [len(c.rounds) for c in load_result(out).cases] == [2, 2]
    assert not list(suite_dir.glob(".out.json*"))  # no temporary file, no lock left
