"""Issue 50: the processes of a launch die with the process that launched them, even a SIGKILLed one
(bench.launch.lifeline): the ranks' server (multiprocessing's forkserver), every process forked from it,
and so multiprocessing's resource tracker, whatever phase the launch was in.

The launches run in a session of their own; what is left of one is read from /proc by session id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import local_ranks
import pytest
from tiny import TINY_LAYER_YAML

from bench.launch import lifeline
from bench.launch.local import rank_context

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal, and /proc (Linux)"
)

HERE = Path(__file__).resolve().parent
PHASE_WAIT_S = 90.0
"""How long a launch may take to reach the phase it is killed in (torch starts slowly on a loaded machine)."""
GONE_WITHIN_S = 5.0
"""How long after the kill the launch's processes may take to exit."""


# --- the signal itself -----------------------------------------------------------------------------------


def _forked(fn) -> int:
    """Run fn() in a forked child that then exits 0; its wait status."""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


def test_die_with_parent_sets_sigkill_and_a_re_parented_child_dies_at_once():
    def armed_then_report() -> None:
        if lifeline.die_with_parent(os.getppid()):
            local_ranks.exit_with_parent_death_signal()

    status = _forked(armed_then_report)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == signal.SIGKILL
    # its parent already gone (another pid than the one it expects): it does not wait for a signal to come
    status = _forked(lambda: lifeline.die_with_parent(os.getppid() + 10**7))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.multirank
def test_every_process_forked_from_the_ranks_server_is_armed():
    """Right after the fork, before its target runs: a pool rank, an elastic rank and the probe alike."""
    child = rank_context([local_ranks.__name__]).Process(target=local_ranks.exit_with_parent_death_signal)
    child.start()
    child.join(60)
    assert child.exitcode == signal.SIGKILL


# --- a killed launcher -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    command: str


def session_processes(session: int) -> list[Proc]:
    """The live processes of `session` (zombies are dead: they only wait to be reaped)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:  # exited meanwhile
            continue
        state, ppid, _, sid = stat[stat.rindex(")") + 2 :].split()[:4]
        if int(sid) == session and state not in ("Z", "X"):
            found.append(Proc(int(entry), int(ppid), b" ".join(argv).decode("utf-8", "replace").strip()))
    return found


@dataclass
class Launch:
    """A launching process in a session of its own, and what has been seen of its processes."""

    proc: subprocess.Popen
    output: Path | None = None
    """The result file it writes (a `bench run`)."""
    servers: set[int] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)

    def look(self) -> list[Proc]:
        procs = session_processes(self.proc.pid)
        self.servers |= {
            p.pid for p in procs if p.ppid == self.proc.pid and "multiprocessing.forkserver" in p.command
        }
        self.ranks |= {p.pid for p in procs if p.ppid in self.servers}
        return procs

    def live_ranks(self) -> int:
        return sum(p.ppid in self.servers for p in self.look())

    def kill_when(self, reached, after_s: float, what: str) -> list[str]:
        """SIGKILL the launcher `after_s` seconds after `reached(self)` first holds; its processes still
        alive GONE_WITHIN_S later, each as "role pid: command". Whatever is left is killed afterwards."""
        try:
            deadline = time.monotonic() + PHASE_WAIT_S
            while (self.look(), not reached(self))[1]:
                assert self.proc.poll() is None, f"it ended (exit {self.proc.returncode}) before {what}"
                assert time.monotonic() < deadline, f"{what} not reached in {PHASE_WAIT_S:g} s"
                time.sleep(0.01)
            end = time.monotonic() + after_s
            while time.monotonic() < end:
                self.look()
                time.sleep(0.01)
            assert self.proc.poll() is None, f"it ended (exit {self.proc.returncode}) before the kill"
            self.proc.kill()
            self.proc.wait()
            gone_by = time.monotonic() + GONE_WITHIN_S
            left = session_processes(self.proc.pid)
            while left and time.monotonic() < gone_by:
                time.sleep(0.05)
                left = session_processes(self.proc.pid)
            return [f"{self._role(p.pid)} {p.pid}: {p.command[:90]}" for p in left]
        finally:
            for proc in session_processes(self.proc.pid):  # what this test started and left behind
                os.kill(proc.pid, signal.SIGKILL)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def _role(self, pid: int) -> str:
        return "server" if pid in self.servers else "rank" if pid in self.ranks else "other"


def start(argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None, **fields) -> Launch:
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )
    return Launch(proc, **fields)


HANGING_LAUNCH = """\
import local_ranks
from bench.launch.local import run_on_ranks

if __name__ == "__main__":
    run_on_ranks(local_ranks.fail, 2, ("hang",), timeout_s=120)
"""


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_killed_launcher_takes_its_ranks_along_from_inside_a_collective(tmp_path: Path):
    """run_on_ranks (torch's elastic agent in the launcher): rank 0 waits in a barrier for rank 1, which
    sleeps; the launcher is SIGKILLed; its server and both ranks are gone within 5 s (they used to wait out
    the collective's timeout, the server with them)."""
    (tmp_path / "launch.py").write_text(HANGING_LAUNCH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    launch = start([sys.executable, "launch.py"], tmp_path, tmp_path / "launch.log", env)
    left = launch.kill_when(lambda w: w.live_ranks() >= 2, 1.5, "two ranks")
    assert not left, "\n".join(left)


# --- a killed `bench run`, at ten times spread over the run ---------------------------------------------


SCENARIO = f"""\
{TINY_LAYER_YAML}warmup: 1
repeat: 2
rounds: 2
cp: [2]
seq_len: [32]
mode: [p2p]
checkpoint: [true]
"""

PHASES = {
    "started": lambda w: True,  # Python still importing bench
    "file": lambda w: w.output.exists(),  # the result file is created before any rank starts
    "server": lambda w: bool(w.servers),  # the ranks' server is up, importing torch
    "rank": lambda w: bool(w.ranks),  # the first rank is forked
    "pool": lambda w: w.live_ranks() >= 2,  # both ranks: joining the store and the group, then the case
    "round 2": lambda w: len(w.ranks) > 2 and w.live_ranks() >= 1,  # round 1 saved, a new pool
}

KILL_TIMES = [
    ("started", 0.0),
    ("file", 0.0),
    ("server", 0.0),
    ("server", 1.0),
    ("rank", 0.0),
    ("pool", 0.0),
    ("pool", 0.8),
    ("pool", 1.6),
    ("round 2", 0.0),
    ("round 2", 1.0),
]
"""(phase, seconds after it is first seen): ten kill times spread over a run, from its start to after its
result file has had a round saved."""


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_a_killed_bench_run_leaves_no_process_behind(suite_dir: Path, write_scenario):
    """Issue 50: `bench run` (one p2p cp 2 case of the tiny layer, 2 rounds) SIGKILLed at each of KILL_TIMES:
    no process of it is alive 5 s later (its forkserver and a rank used to outlive it by minutes)."""
    write_scenario("orphans", SCENARIO)
    survivors = {}
    for phase, after_s in KILL_TIMES:
        output = suite_dir / f"killed-{phase.replace(' ', '')}-{after_s:g}.json"
        argv = [sys.executable, "-m", "bench", "run", "orphans", "--output", str(output)]
        launch = start(argv, suite_dir, output.with_suffix(".log"), output=output)
        left = launch.kill_when(PHASES[phase], after_s, f"phase {phase!r}")
        if left:
            survivors[f"{phase} +{after_s:g} s"] = left
    assert not survivors, "\n".join(f"killed at {when}: {left}" for when, left in survivors.items())
