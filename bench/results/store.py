"""Result files: one JSON file per run, written after every case, read back into typed records.

    run = RunResult(name=..., environment=..., suite=..., scenarios=..., cases=[])
    writer = ResultWriter(path, run)        # creates the file (no cases yet); never over an existing one
    writer.add(CaseResult(...))             # replaces any earlier result of the same case; rewrites the file
    run = load_result(path)                 # converts schema 1; refuses other versions

Writes are atomic (a temporary file in the same folder, then os.replace), so an interrupted run leaves a
valid file holding every case finished so far; `bench run --resume FILE` continues it.

Layout (schema_version 2): {schema_version, name, created_at, environment: {...}, suite: {...},
scenarios: {name: definition}, schedule_seed, session, cases: [{params: {...case...}, status, error,
rounds: [{samples_s: [rank][repeat], contention, wall_s, position, started_at}], estimate: {...},
timing: {...}, memory: {...}, threads_per_rank, wall_s, finished_at}], verifications: [{kind, params, ...}],
command: [argv...]}. Times are in seconds, memory in bytes. Each case keeps its samples per round (one
round: one pool lifetime, bench.launch.pool); `estimate` is the round-level estimate with its confidence
interval (bench.results.statistics), `timing` the statistics of every timed pass of every round together.
`verifications` (the records of `bench verify`, see bench/results/verifications.py) and `command` (the argv
of the run) are optional: files written before they existed load with none. docs/result-schema.json is the
JSON Schema of the layout (bench.results.schema generates it).

Schema 1 (one launch per case, `samples_s` on the case) is converted on reading: its samples become the
case's one round, without an interval (bench.results.migrate).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bench.errors import FieldError, UserError
from bench.measure.contention import Contention
from bench.measure.timing import TimingSummary, rank_max
from bench.results.env import Environment, now_iso
from bench.results.migrate import UPGRADES, upgrade
from bench.results.paths import numbered_paths
from bench.results.statistics import Estimate
from bench.results.verifications import Verification, verification_from_dict
from bench.suite.config import Case, check_fields

SCHEMA_VERSION = 2
"""Bump when the layout changes; load_result converts version 1 (bench.results.migrate), refuses others."""

Status = Literal["ok", "failed", "skipped"]

SESSION_ENV = "BENCH_SESSION"
"""Set by `bench compare` for both sides of an interleaved run; `bench run` records it (RunResult.session)."""

MEMORY_INCLUDES = (
    "peak allocated during one pass on a rank: parameters, input shard and output gradient live at the "
    "start, plus the pass's activations, gradients, temporaries and communication buffers"
)


@dataclass(kw_only=True, slots=True)
class MemoryResult:
    """Peak allocated memory of a case: rank-max, and per rank."""

    peak_bytes: int
    """Max over ranks of the per-rank peak."""
    per_rank_bytes: list[int]
    """Peak of each rank."""
    baseline_bytes: list[int]
    """Bytes live at the start of the pass, per rank."""
    meter: str
    """How it was measured: npu-allocator, cuda-allocator or cpu-profiler (bench.measure.memory)."""
    includes: str = MEMORY_INCLUDES
    """What the number counts."""
    device_used_bytes: list[int] | None = None
    """npu/cuda: each rank's device memory in use after the pass, inside torch's allocator or not (NCCL/HCCL
    buffers, the context, cached blocks: mem_get_info's total - free); None on cpu and in older files."""

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20


@dataclass(kw_only=True, slots=True)
class ThroughputResult:
    """How close a case ran to the machine's limit: the model FLOPs of its pass against the measured matmul
    throughput of its ranks."""

    model_flops: int
    """FLOPs of one pass of the layer on the global sequence, all ranks together (the formula of
    gdn_cp.layers.GatedDeltaNetConfig.flops: projections, Conv1D and the chunked core; backward = 2x)."""
    matmul_gflops: float
    """The slowest rank's throughput on batched chunk x head-dim products (C x K @ K x V) in the dtype the
    core's matmuls run in (bench.measure.throughput), GFLOP/s."""
    matmul_dtype: str | None = None
    """That dtype as the matmul runs it: fp32, tf32, bf16, fp16, fp64 (bench.measure.throughput.
    matmul_dtype_name); None in files written before it was recorded (fp32 or fp64 then)."""

    def achieved_gflops(self, median_s: float, cp: int) -> float:
        """Model GFLOP/s per rank at the case's median time (every rank holds 1/cp of the work)."""
        return self.model_flops / cp / median_s / 1e9

    def fraction(self, median_s: float, cp: int) -> float:
        """achieved_gflops as a fraction of matmul_gflops."""
        return self.achieved_gflops(median_s, cp) / self.matmul_gflops


@dataclass(kw_only=True, slots=True)
class RoundResult:
    """One round of a case: its timed passes in one pool lifetime (bench.launch.pool)."""

    samples_s: list[list[float]]
    """[rank][repeat] elapsed seconds of the timed pass."""
    contention: Contention | None = None
    """How shared the machine was while this round was timed (None where unknown)."""
    wall_s: float = 0.0
    """Wall time of the case in this round, from handing it to the ranks to their answer."""
    position: int = 0
    """Its place in the round's shuffled order (0: first); see RunResult.schedule_seed."""
    started_at: str = field(default_factory=now_iso)

    @property
    def median_s(self) -> float:
        """The round median: median over repeats of the rank-max time."""
        return float(np.median(rank_max(self.samples_s)))

    @property
    def contended(self) -> bool:
        return self.contention is not None and self.contention.contended

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples_s": self.samples_s,
            "contention": None if self.contention is None else dataclasses.asdict(self.contention),
            "wall_s": self.wall_s,
            "position": self.position,
            "started_at": self.started_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoundResult:
        contention = data.get("contention")
        return cls(
            samples_s=data["samples_s"],
            contention=None if contention is None else Contention.from_dict(contention),
            wall_s=data["wall_s"],
            position=data["position"],
            started_at=data["started_at"],
        )


def clean_rounds(rounds: Sequence[RoundResult]) -> list[RoundResult]:
    """The rounds an estimate uses: the uncontended ones, or all when none is (then the case's contention
    says so)."""
    clean = [r for r in rounds if not r.contended]
    return clean or list(rounds)


@dataclass(kw_only=True, slots=True)
class CaseResult:
    """The outcome of one case, over its rounds."""

    case: Case
    """The case as it ran (its full configuration; `params` in the file)."""
    status: Status
    """ok; failed (an exception, OOM, dead rank or timeout: `error`); skipped (not run: `error` says why)."""
    error: str | None = None
    """failed: the first failing rank and its error; skipped: the reason."""
    rounds: list[RoundResult] = field(default_factory=list)
    """The rounds measured so far, in the order they ran (ok rounds only; a failure ends the case)."""
    estimate: Estimate | None = None
    """The case's time: geometric mean of its clean rounds' medians with a 95% interval
    (bench.results.statistics); ok only."""
    timing: TimingSummary | None = None
    """Rank-max statistics over every timed pass of every round together (ok only)."""
    memory: MemoryResult | None = None
    """Peak allocated memory, measured in the last round (ok only)."""
    threads_per_rank: int | None = None
    """torch threads each rank ran with (ok only)."""
    throughput: ThroughputResult | None = None
    """Model FLOPs against the measured matmul limit (ok only; None in files written before it existed)."""
    contention: Contention | None = None
    """The most shared of the rounds the estimate uses (ok only; None where unknown): contended only when
    every round was (`contended`)."""
    wall_s: float = 0.0
    """Wall time of the case, all rounds together (a one-case launch: start-up included)."""
    finished_at: str = field(default_factory=now_iso)

    @property
    def key(self) -> str:
        return self.case.key()

    @property
    def contended(self) -> bool:
        """Every round was timed while the machine was shared (its estimate then uses them all, and is not the
        code's time alone): `contention`, the least shared of them, says so."""
        return self.contention is not None and self.contention.contended

    @property
    def contended_rounds(self) -> int:
        """Rounds timed while the machine was shared (the estimate leaves them out while any is clean)."""
        return sum(r.contended for r in self.rounds)

    @property
    def estimate_medians(self) -> list[float]:
        """The round medians its estimate is made of, in seconds: those of `clean_rounds`."""
        return [r.median_s for r in clean_rounds(self.rounds)]

    @property
    def samples_s(self) -> list[list[float]] | None:
        """[rank][repeat of every round, in order] elapsed seconds; None without rounds."""
        if not self.rounds:
            return None
        ranks = len(self.rounds[0].samples_s)
        return [[s for r in self.rounds for s in r.samples_s[rank]] for rank in range(ranks)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.case.to_dict(),
            "status": self.status,
            "error": self.error,
            "rounds": [r.to_dict() for r in self.rounds],
            "estimate": None if self.estimate is None else dataclasses.asdict(self.estimate),
            "timing": None if self.timing is None else dataclasses.asdict(self.timing),
            "memory": None if self.memory is None else dataclasses.asdict(self.memory),
            "threads_per_rank": self.threads_per_rank,
            "throughput": None if self.throughput is None else dataclasses.asdict(self.throughput),
            "contention": None if self.contention is None else dataclasses.asdict(self.contention),
            "wall_s": self.wall_s,
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        return cls(
            case=Case.from_dict(data["params"]),
            status=data["status"],
            error=data["error"],
            rounds=[RoundResult.from_dict(r) for r in data["rounds"]],
            estimate=None if data["estimate"] is None else Estimate(**data["estimate"]),
            timing=None if data["timing"] is None else TimingSummary(**data["timing"]),
            memory=None if data["memory"] is None else MemoryResult(**data["memory"]),
            threads_per_rank=data["threads_per_rank"],
            throughput=None if data.get("throughput") is None else ThroughputResult(**data["throughput"]),
            contention=None if data.get("contention") is None else Contention.from_dict(data["contention"]),
            wall_s=data["wall_s"],
            finished_at=data["finished_at"],
        )


@dataclass(kw_only=True, slots=True)
class RunResult:
    """One result file."""

    name: str
    """What ran: the scenario names joined by '+'."""
    environment: Environment
    """Code, machine and software identity."""
    suite: dict[str, Any]
    """The suite settings the run used (bench.yaml plus --set)."""
    scenarios: dict[str, dict[str, Any]]
    """Each scenario's definition (after --set), by name: what makes two runs comparable."""
    cases: list[CaseResult] = field(default_factory=list)
    """In the order they finished."""
    created_at: str = field(default_factory=now_iso)
    schema_version: int = SCHEMA_VERSION
    verifications: list[Verification] = field(default_factory=list)
    """`bench verify` records (layer comparisons, training trajectories), in the order they finished."""
    command: list[str] | None = None
    """The command line that made the run, as argv (`["bench", "run", "cpu-smoke", "--set", "repeat=3"]`);
    None in files written before it was recorded, and for runs not made by `bench run` or `bench verify`."""
    schedule_seed: int | None = None
    """Seed of the shuffled order of every round (bench.launch.schedule); None in runs without rounds."""
    session: str | None = None
    """Shared by the two sides of a `bench compare REF REF`, whose rounds ran interleaved in one session
    (the BENCH_SESSION environment variable); None for a run of its own."""

    def get(self, key: str) -> CaseResult | None:
        return next((c for c in self.cases if c.key == key), None)

    def ok_keys(self) -> set[str]:
        """Cases ok so far (possibly with rounds still to run: CaseResult.rounds against case.rounds)."""
        return {c.key for c in self.cases if c.status == "ok"}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "created_at": self.created_at,
            "environment": self.environment.to_dict(),
            "suite": self.suite,
            "scenarios": self.scenarios,
            "cases": [c.to_dict() for c in self.cases],
            "verifications": [v.to_dict() for v in self.verifications],
            "command": self.command,
            "schedule_seed": self.schedule_seed,
            "session": self.session,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        return cls(
            schema_version=data["schema_version"],
            name=data["name"],
            created_at=data["created_at"],
            environment=Environment.from_dict(data["environment"]),
            suite=data["suite"],
            scenarios=data["scenarios"],
            cases=[CaseResult.from_dict(c) for c in data["cases"]],
            verifications=[verification_from_dict(v) for v in data.get("verifications", [])],
            command=data.get("command"),
            schedule_seed=data.get("schedule_seed"),
            session=data.get("session"),
        )


def load_result(path: str | Path) -> RunResult:
    """Read a result file; UserError (with what to do) if it is missing, unreadable (a folder, not text, no
    permission), corrupt, of another schema, or holds a value of the wrong type."""
    path = Path(path)
    if path.exists() and not (path.is_file() or path.is_dir()):  # a device or pipe: reading may never end
        raise UserError(f"{path}: not a regular file; give a result file that `bench run` wrote")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{path}: no such result file; give a file that `bench run` wrote (see results/)"
        ) from None
    except IsADirectoryError:
        raise UserError(
            f"{path}: is a folder, not a result file; give one of the .json files `bench run` wrote"
        ) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror}); check its permissions") from None
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path}: not a text file (byte {exc.start} is not UTF-8); give a result file that `bench run` "
            "wrote"
        ) from None
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); give a result file that `bench run` wrote"
        ) from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION and version not in UPGRADES:
        readable = ", ".join(str(v) for v in (*sorted(UPGRADES), SCHEMA_VERSION))
        raise UserError(
            f"{path}: schema_version {version!r} is not a version this bench reads ({readable}; it "
            f"writes {SCHEMA_VERSION}); re-run its scenarios with this bench (`bench run`), or read it with "
            "the bench version that wrote it"
        )
    try:
        run = RunResult.from_dict(upgrade(data))
        _check_types(run)
    except FieldError as exc:
        raise UserError(
            f"{path}: {exc.key}: {exc.message.split('; ')[0]}; give a file that `bench run` wrote (or "
            "correct that value)"
        ) from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(
            f"{path}: not a bench result file of schema {SCHEMA_VERSION} ({type(exc).__name__}: {exc}); "
            "give a file that `bench run` wrote"
        ) from None
    return run


def _check_types(run: RunResult) -> None:
    """FieldError("cases[i].timing.median_s", ...) for a value that its field's annotation does not allow
    (e.g. `median_s: "fast"`), so that a bad file is refused on reading instead of failing in a table."""
    command = run.command
    if command is not None and not (isinstance(command, list) and all(isinstance(a, str) for a in command)):
        raise FieldError(
            "command", f"expected a list of strings (argv) or null, got {command!r}; fix the value"
        )
    parts: list[tuple[str, Any]] = [("environment", run.environment)]
    for i, c in enumerate(run.cases):
        parts += [(f"cases[{i}]", c), (f"cases[{i}].timing", c.timing), (f"cases[{i}].memory", c.memory)]
        parts += [(f"cases[{i}].throughput", c.throughput), (f"cases[{i}].estimate", c.estimate)]
        parts += [(f"cases[{i}].rounds[{j}]", r) for j, r in enumerate(c.rounds)]
    for where, record in parts:
        if record is None:
            continue
        try:
            check_fields(record)
        except FieldError as exc:
            raise FieldError(f"{where}.{exc.key}", exc.message) from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


LISTED = ("cases", "verifications")
"""Top-level keys whose items get a line each."""


def result_text(data: dict[str, Any]) -> str:
    """The JSON text of a result file: a line per top-level key, and a line per case and verification. Each
    line comes from json's C encoder (an indented dump runs in Python: bench run rewrites the file after every
    case-round, 190 times in cpu-smoke, and that took seconds); a case per line also reads well in a diff."""
    lines = []
    for key, value in data.items():
        if key in LISTED and value:
            items = ",\n".join(f"  {json.dumps(item)}" for item in value)
            lines.append(f" {json.dumps(key)}: [\n{items}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


class ResultWriteError(OSError):
    """A result file could not be written (the disk full, the folder gone or read-only). The file, written
    atomically, still holds what it held before the failed write."""


def save_result(run: RunResult, path: str | Path, *, new: bool = False) -> None:
    """Write atomically: a temporary file in the same folder, then os.replace over `path`. `new`: `path`
    must not exist (FileExistsError): the temporary file is hard-linked to it instead, which fails on a
    taken name, so that two runs can never write one file. ResultWriteError (one error, the temporary file
    removed) when the file system refuses the write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private; results are shared like any file
        with os.fdopen(fd, "w") as f:
            f.write(result_text(run.to_dict()))
            f.flush()
            os.fsync(f.fileno())
        if new:
            _link_new(tmp, path)
        else:
            os.replace(tmp, path)
    except FileExistsError:
        Path(tmp).unlink(missing_ok=True)
        raise
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        # from None: closing the half-written file fails again (ENOSPC twice), which says nothing more
        raise ResultWriteError(exc.errno, f"cannot write {path}: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _link_new(tmp: str, path: Path) -> None:
    """Give the complete file `tmp` the name `path`, FileExistsError when the name is taken. A hard link is
    atomic; where the file system has none, the name is claimed with O_EXCL and then replaced."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (some network and FUSE file systems)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        os.replace(tmp, path)
        return
    os.unlink(tmp)


class ResultWriter:
    """Keeps a run's file up to date: every `add` rewrites it atomically."""

    def __init__(self, path: str | Path, run: RunResult, *, numbered: bool = False) -> None:
        """Create the run's file, never over an existing one: FileExistsError, or with `numbered` the first
        free name of `path`, <stem>-2, <stem>-3, ... (default names have one-second resolution). OSError when
        it cannot be written there."""
        self.run = run
        Path(path).parent.mkdir(parents=True, exist_ok=True)  # FileExistsError here: a parent is a file
        for candidate in numbered_paths(Path(path)):
            try:
                save_result(run, candidate, new=True)
            except FileExistsError:
                if numbered:
                    continue
                raise
            self.path = candidate
            self.saved = 0
            return

    @classmethod
    def resume(cls, path: str | Path) -> ResultWriter:
        """Continue an existing file (bench run --resume)."""
        writer = cls.__new__(cls)
        writer.path = Path(path)
        writer.run = load_result(path)
        writer.saved = len(writer.run.cases) + len(writer.run.verifications)
        return writer

    saved: int
    """Records (cases and verify records) the file held after its last successful write."""

    def add(self, result: CaseResult) -> None:
        """Record a case (replacing an earlier result of the same case, e.g. a failure being retried)."""
        self.run.cases = [c for c in self.run.cases if c.key != result.key]
        self.run.cases.append(result)
        self._save()

    def add_verification(self, record: Verification) -> None:
        """Record a `bench verify` case (replacing an earlier record of the same check and case)."""
        self.run.verifications = [v for v in self.run.verifications if v.key != record.key]
        self.run.verifications.append(record)
        self._save()

    def _save(self) -> None:
        save_result(self.run, self.path)  # ResultWriteError: the file keeps its last `saved` records
        self.saved = len(self.run.cases) + len(self.run.verifications)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+]+", "-", text).strip("-.") or "x"


def result_filename(created: datetime.datetime, branch: str, commit: str, name: str) -> str:
    """`<YYYYmmdd-HHMMSS>-<branch>-<shortcommit>-<name>.json`, with unsafe characters replaced by '-'."""
    return f"{created:%Y%m%d-%H%M%S}-{_slug(branch)}-{_slug(commit[:8])}-{_slug(name)[:80]}.json"
