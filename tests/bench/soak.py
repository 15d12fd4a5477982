"""A fault-injection soak of `bench run` (issue 50): many cases of a tiny scenario while everything that can
go wrong does, and `--resume` until the sweep completes. Faults:

- a backend that fails at random (tests/bench/op_site: 1 call in `every` raises, seeded per process);
- ranks SIGKILLed at random moments (`kills` of them, spread over the first run);
- the results folder read-only for `read_only_s` seconds in the middle of the first run (the run stops with
  one line; the next `--resume` continues once it is writable).

After every `bench run` it checks: the result file is valid (it loads); no process of that run is alive 5 s
after it ended; every case that was ok keeps the rounds it had (never measured again) and has exactly its
one round. At the end every case is ok or failed with its error, and the total wall time is reported.

    python tests/bench/soak.py --cases 200 --kills 2 --read-only 30      # the issue's soak, a few minutes
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.results.store import load_result

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
OP_SITE = TESTS / "bench" / "op_site"

SUITE = """\
device: cpu
warmup: 1
repeat: 1
rounds: 1
timeout_s: 60
default_scenario: soak
"""
SCENARIO = """\
description: the soak's tiny cases
hidden_size: 32
num_k_heads: 2
num_v_heads: 4
head_k_dim: 8
head_v_dim: 8
chunk_size: 8
dtype: fp32
cp: [1, 2]
mode: [ulysses, p2p]
checkpoint: [true]
pass: [forward]
seq_len: {lengths}
"""


@dataclass
class Soak:
    """What one soak saw."""

    runs: list[int] = field(default_factory=list)
    """Each `bench run`'s exit code, in order."""
    killed: list[str] = field(default_factory=list)
    """The processes killed (their command lines)."""
    read_only_stops: int = 0
    """Runs that stopped because the folder was read-only."""
    ok: int = 0
    failed: int = 0
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    """Every check that failed (empty: the soak passed)."""


def _session_processes(session: int) -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every live process in `session` (/proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == session:
            out.append((int(entry.name), int(fields[1]), cmdline.strip()))
    return out


def _ranks(bench_pid: int, session: int) -> list[tuple[int, str]]:
    """The rank processes of the run: grandchildren of bench (children of its forkserver)."""
    processes = _session_processes(session)
    children = {pid for pid, parent, _ in processes if parent == bench_pid}
    return [(pid, cmd) for pid, parent, cmd in processes if parent in children]


def soak(
    folder: Path,
    *,
    cases: int = 200,
    kills: int = 2,
    read_only_s: float = 30.0,
    every: int = 10,
    seed: int = 0,
    window_s: float = 60.0,
    run_limit_s: float = 1800.0,
) -> Soak:
    """Run the soak in `folder` (module docstring)."""
    rng = random.Random(seed)
    lengths = [16 * (i + 1) for i in range(max(1, cases // 4))]
    (folder / "scenarios").mkdir(parents=True, exist_ok=True)
    (folder / "bench.yaml").write_text(SUITE)
    (folder / "scenarios" / "soak.yaml").write_text(SCENARIO.format(lengths=lengths))
    results = folder / "out"
    results.mkdir(exist_ok=True)
    out, flag = results / "soak.json", folder / "read-only.flag"
    env = {**os.environ, "BENCH_TEST_OP": "flaky", "BENCH_TEST_FLAKY_EVERY": str(every)}
    env |= {"BENCH_TEST_FLAKY_SEED": str(seed), "BENCH_TEST_READ_ONLY": f"{flag}:{results.resolve()}"}
    env["PYTHONPATH"] = os.pathsep.join([str(OP_SITE), str(REPO), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "200"
    report, kept = Soak(), {}
    faults = Faults(rng, kills, read_only_s, flag, report, window_s)
    start = time.monotonic()
    threading.Thread(target=faults.run, daemon=True).start()
    while len(report.runs) < 20:
        argv = [sys.executable, "-m", "bench", "run", "soak"]
        argv += ["--output", str(out)] if not report.runs else ["--resume", str(out)]
        proc = subprocess.Popen(
            argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        faults.current = proc
        try:
            output = proc.communicate(timeout=run_limit_s)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            report.problems.append(f"run {len(report.runs) + 1} did not end in {run_limit_s:g} s")
            break
        report.runs.append(proc.returncode)
        if proc.returncode == 1 and "--resume" in output:  # stopped, saying how to continue
            report.read_only_stops += "could not" in output
        _check_after(proc.pid, out, kept, report)
        if proc.returncode in (0, 2):  # the sweep completed (2: some cases failed, recorded)
            break
        while flag.exists():  # resume once the folder is writable again
            time.sleep(0.2)
    faults.stop = True
    flag.unlink(missing_ok=True)
    report.wall_s = time.monotonic() - start
    return report


@dataclass
class Faults:
    """The faults of a soak, at moments counted from its start, on whichever run is current: `kills` ranks
    SIGKILLed between 5 s and `window_s`, and the results folder read-only for `read_only_s` from a moment
    between a quarter and half of `window_s`."""

    rng: random.Random
    kills: int
    read_only_s: float
    flag: Path
    report: Soak
    window_s: float = 60.0
    current: subprocess.Popen | None = None
    stop: bool = False

    def run(self) -> None:
        begun = time.monotonic()
        moments = sorted(self.rng.uniform(5, self.window_s) for _ in range(self.kills))
        read_only = self.rng.uniform(self.window_s / 4, self.window_s / 2)
        while not self.stop and (moments or read_only is not None):
            now = time.monotonic() - begun
            if read_only is not None and now >= read_only:
                self.flag.touch()
                if now >= read_only + self.read_only_s:
                    self.flag.unlink(missing_ok=True)
                    read_only = None
            proc = self.current
            if moments and now >= moments[0] and proc is not None and proc.poll() is None:
                ranks = _ranks(proc.pid, proc.pid)
                if ranks:
                    pid, cmd = self.rng.choice(ranks)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        self.report.killed.append(cmd)
                        moments.pop(0)
            time.sleep(0.1)


def _check_after(bench_pid: int, out: Path, kept: dict, report: Soak) -> None:
    """The checks after one `bench run` (module docstring); updates `kept` (ok cases' rounds)."""
    time.sleep(5)
    left = _session_processes(bench_pid)
    if left:
        report.problems.append(f"processes left 5 s after a run ended: {[cmd for _, _, cmd in left]}")
        for pid, _, _ in left:
            os.kill(pid, signal.SIGKILL)
    if not out.exists():
        return
    try:
        run = load_result(out)
    except Exception as exc:  # a file that does not load is what the soak looks for
        report.problems.append(f"the result file does not load: {exc}")
        return
    report.ok = sum(r.status == "ok" for r in run.cases)
    report.failed = sum(r.status == "failed" for r in run.cases)
    for result in run.cases:
        if result.status != "ok":
            continue
        rounds = [(r.started_at, r.samples_s) for r in result.rounds]
        if len(rounds) != 1:
            report.problems.append(f"{result.case.case_id}: {len(rounds)} rounds, not one")
        if result.key in kept and kept[result.key] != rounds:
            report.problems.append(f"{result.case.case_id}: measured again by a later run")
        kept[result.key] = rounds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument(
        "--read-only", type=float, default=30.0, help="seconds the results folder is read-only"
    )
    parser.add_argument("--every", type=int, default=10, help="the backend fails 1 call in this many")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        report = soak(
            Path(folder), cases=args.cases, kills=args.kills, read_only_s=args.read_only, every=args.every,
            seed=args.seed,
        )  # fmt: skip
    print(
        f"soak: {len(report.runs)} runs (exit codes {report.runs}), {len(report.killed)} ranks killed, "
        f"{report.read_only_stops} read-only stops, {report.ok} cases ok, {report.failed} failed, "
        f"{report.wall_s:.0f} s"
    )
    for problem in report.problems:
        print(f"problem: {problem}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
