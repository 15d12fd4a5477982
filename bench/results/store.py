"""Result files: one JSON file per run, written after every case, read back into typed records.

    run = RunResult(name=..., environment=..., suite=..., scenarios=..., cases=[])
    writer = ResultWriter(path, run)        # creates the file (no cases yet); never over an existing one
    writer.add(CaseResult(...))             # replaces any earlier result of the same case; rewrites the file
    run = load_result(path)                 # converts older schemas (migrate); refuses newer ones

Writes are atomic (a temporary file in the same folder, then os.replace), so an interrupted run leaves a
valid file holding every case finished so far; `bench run --resume FILE` continues it.

The records below are the one declaration of the layout: bench.records derives from them the JSON
(field names as keys), its strict reading (every error with its file and line) and the JSON Schema
(docs/result-schema.json, bench.results.schema). A RunResult holds its environment, the suite and each
scenario's definition, then a case per line: the case (CaseResult.case), its rounds with their samples
[rank][repeat], the estimate over rounds and the timing over every pass, memory, throughput and contention;
then the `bench verify` records (bench/results/verifications.py). Times are in seconds, memory in bytes.
Files of older schema versions are converted on reading, as bench.results.migrate lists.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ValidationError

from bench.errors import UserError
from bench.measure.contention import Contention
from bench.measure.gate import CaseCheck
from bench.measure.statistics import Estimate
from bench.measure.timing import TimingSummary, rank_max
from bench.records import RECORD_CONFIG, describe_error, from_json, to_dict
from bench.results.env import Environment, now_iso
from bench.results.migrate import SCHEMA_VERSION, UPGRADES, upgrade
from bench.results.paths import numbered_paths
from bench.results.verifications import Verification, run_name
from bench.suite.config import Case, SuiteConfig
from gdn_cp.ops.ran import Ran

Status = Literal["ok", "failed", "skipped"]

NOT_COMPARABLE = "not comparable: "
"""How a skipped case's error begins when it could not run as named on a compared ref (a field its gdn_cp
does not take: bench.launch.paired); `bench compare` counts it as not comparable."""

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
    buffers, the context, cached blocks: mem_get_info's total - free); None on cpu."""
    device_used_before_bytes: list[int] | None = None
    """npu/cuda: each rank's device memory in use before the pass, the allocator's cached blocks released
    first (so that no earlier case's cache counts); None on cpu and in files before version 6."""
    reserved_peak_bytes: list[int] | None = None
    """npu/cuda: each rank's allocator peak reserved bytes during the pass (its blocks, cached ones
    included); None on cpu and in files before version 6."""

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
    matmul_dtype_name); None where it was not recorded (bench.results.migrate)."""

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
    lifetime: str | None = None
    """The id of the ranks' lifetime (a local pool's) it ran in; None under torchrun and in older files. The
    two sides of a paired `bench compare REF REF` record one id for a case's round, both measured in it."""
    first_use_s: float | None = None
    """Rank-max wall time of the round's first pass (untimed by the case's figures: a backend's compiles,
    autotuning and caches are in it; bench.measure.rank); None in files before version 7."""

    @property
    def passes_s(self) -> list[float]:
        """[repeat] the rank-max time of each timed pass, in the order they ran."""
        return rank_max(self.samples_s)

    @property
    def median_s(self) -> float:
        """The round median: median over repeats of the rank-max time."""
        return float(np.median(self.passes_s))

    @property
    def contended(self) -> bool:
        return self.contention is not None and self.contention.contended


def clean_rounds(rounds: Sequence[RoundResult]) -> list[RoundResult]:
    """The rounds an estimate uses: the uncontended ones, or all when none is (then the case's contention
    says so)."""
    clean = [r for r in rounds if not r.contended]
    return clean or list(rounds)


@dataclass(kw_only=True, slots=True)
class CaseResult:
    """The outcome of one case, over its rounds."""

    __pydantic_config__ = RECORD_CONFIG

    case: Case
    """The case as it ran (its full configuration)."""
    status: Status
    """ok; failed (an exception, OOM, dead rank or timeout: `error`); skipped (not run: `error` says why)."""
    error: str | None = None
    """failed: the first failing rank and its error; skipped: the reason."""
    rounds: list[RoundResult] = field(default_factory=list)
    """The rounds measured so far, in the order they ran (ok rounds only; a failure ends the case)."""
    estimate: Estimate | None = None
    """The case's time: geometric mean of its clean rounds' medians with a 95% interval
    (bench.measure.statistics); ok only."""
    timing: TimingSummary | None = None
    """Rank-max statistics over every timed pass of every round together (ok only)."""
    memory: MemoryResult | None = None
    """Peak allocated memory, read in the case's first round of the run that measured it (ok only)."""
    threads_per_rank: int | None = None
    """torch threads each rank ran with (ok only)."""
    throughput: ThroughputResult | None = None
    """Model FLOPs against the measured matmul limit (ok only)."""
    contention: Contention | None = None
    """The most shared of the rounds the estimate uses (ok only; None where unknown): contended only when
    every round was (`contended`)."""
    wall_s: float = 0.0
    """Wall time of the case, all rounds together (a one-case launch: start-up included)."""
    ran: list[Ran] | None = None
    """What the case's first pass ran, as gdn_cp recorded it on rank 0 (gdn_cp.ops.ran: the mode, its options
    as applied, the local path, the ops the backend seam called), checked against the case before any pass
    was timed (bench.measure.gate); None: not recorded (files before version 7, a compared ref whose gdn_cp
    does not record it)."""
    check: CaseCheck | None = None
    """The correctness gate's reference checks of its first round (bench.measure.gate); None: not checked
    (files before version 7)."""
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
    def seconds(self) -> float | None:
        """The one time of the case every figure derived from it uses (every view's time, throughput,
        scaling, the model's check): its estimate across rounds, else (one round) its median over repeats;
        None when not measured."""
        if self.estimate is not None:
            return self.estimate.median_s
        return None if self.timing is None else self.timing.median_s

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


@dataclass(kw_only=True, slots=True)
class RunResult:
    """One result file."""

    __pydantic_config__ = RECORD_CONFIG

    schema_version: int = SCHEMA_VERSION
    """The layout's version (bench.results.migrate holds its history)."""
    name: str
    """What ran: the scenario names joined by '+'."""
    environment: Environment
    """Code, machine and software identity."""
    suite: SuiteConfig
    """The suite settings the run used (bench.yaml plus --set)."""
    scenarios: dict[str, dict[str, Any]]
    """Each scenario's definition (after --set), by name: what makes two runs comparable."""
    cases: list[CaseResult] = field(default_factory=list)
    """In the order they finished."""
    created_at: str = field(default_factory=now_iso)
    verifications: list[Verification] = field(default_factory=list)
    """`bench verify` records (layer comparisons, training trajectories), in the order they finished."""
    command: list[str] | None = None
    """The command line that made the run, as argv (`["bench", "run", "cpu-smoke", "--set", "repeat=3"]`);
    None for runs not made by `bench run` or `bench verify`."""
    schedule_seed: int | None = None
    """Seed of the shuffled order of every round (bench.launch.schedule); None in runs without rounds."""
    session: str | None = None
    """Shared by the two sides of a `bench compare REF REF`, whose rounds ran interleaved in one session
    (the BENCH_SESSION environment variable); None for a run of its own."""
    measured_by: str | None = None
    """The commit of the bench that measured this run's code when it is not the code's own (environment's
    git_commit): a paired `bench compare REF REF` measures both refs' gdn_cp with the bench of the checkout
    it runs in (bench.launch.paired); None: the code's own bench."""

    def get(self, key: str) -> CaseResult | None:
        return next((c for c in self.cases if c.key == key), None)

    def ok_keys(self) -> set[str]:
        """Cases ok so far (possibly with rounds still to run: CaseResult.rounds against case.rounds)."""
        return {c.key for c in self.cases if c.status == "ok"}


def load_result(path: str | Path) -> RunResult:
    """Read a result file; UserError (with what to do) if it is missing, unreadable (a folder, not text, no
    permission), corrupt, of another schema, or holds a value of the wrong type."""
    return parse_result(path, read_result_text(path))


def read_result_text(path: str | Path) -> str:
    """The text of a file given as a result file; UserError when it is missing, a folder, a device, not
    text or not readable."""
    path = Path(path)
    if path.exists() and not (path.is_file() or path.is_dir()):  # a device or pipe: reading may never end
        raise UserError(f"{path}: not a regular file; give a result file that `bench run` wrote")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(
            f"{path}: no such result file; give a file that `bench run` wrote (see runs/)"
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


RESULT_MARK = re.compile(r'\s*\{\s*"schema_version"\s*:')
"""How every result file opens (result_text writes schema_version first)."""


def is_result_text(text: str) -> bool:
    """Whether `text` is a result file's, by the key every result file has: a top-level `schema_version`
    (what the views, `bench history` and the output guard, bench.results.outputs, go by). Text that is not
    valid JSON counts when it opens with that key (a result file cut short), so that a damaged result file
    is refused, never taken for something else."""
    if '"schema_version"' not in text:  # a trace of many megabytes is not parsed to find that out
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return RESULT_MARK.match(text) is not None
    return isinstance(data, dict) and "schema_version" in data


def parse_result(path: str | Path, text: str) -> RunResult:
    """The records of a result file's `text` (read from `path`, which messages name): older schemas
    converted (bench.results.migrate); UserError, with what to do, for anything else."""
    try:
        data = json.loads(text)
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
    converted = ""
    if version != SCHEMA_VERSION:
        try:
            text = json.dumps(upgrade(data))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(
                f"{path}: not a bench result file of schema {version} ({type(exc).__name__}: {exc}); give a "
                "file that `bench run` wrote"
            ) from None
        converted = f" (converted from schema {version})"
    try:
        return from_json(RunResult, text)
    except ValidationError as exc:
        line, problem = describe_error(exc, text)
        where = f"{path}:{line}" if line is not None and not converted else str(path)
        raise UserError(
            f"{where}: {problem}{converted}; give a file that `bench run` wrote (or correct that value)"
        ) from None


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
    tmp = ""
    try:
        # in the try: a folder turned read-only (or full) refuses the temporary file itself
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private; results are shared like any file
        with os.fdopen(fd, "w") as f:
            f.write(result_text(to_dict(run)))
            f.flush()
            os.fsync(f.fileno())
        if new:
            _link_new(tmp, path)
        else:
            os.replace(tmp, path)
    except FileExistsError:
        _remove(tmp)
        raise
    except OSError as exc:
        _remove(tmp)
        # from None: closing the half-written file fails again (ENOSPC twice), which says nothing more
        raise ResultWriteError(exc.errno, f"cannot write {path}: {exc.strerror}") from None
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: str) -> None:
    """Remove the temporary file of a failed write, if it was made (a read-only folder may keep it)."""
    if tmp:
        with contextlib.suppress(OSError):
            Path(tmp).unlink(missing_ok=True)


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


def is_verification_run(run: RunResult) -> bool:
    """Whether a result file was written by `bench verify` (records, or its name when none finished)."""
    return bool(run.verifications) or run.name in {
        run_name(list(run.scenarios), train=train) for train in (False, True)
    }
