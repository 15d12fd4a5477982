"""Result files as rows of data (long format), for pandas, a spreadsheet or a database: what `bench export`
and `bench show --format json` print, and what bench.api.dataframe builds a DataFrame from.

Every row has the same columns (COLUMNS), whatever its file holds, so that rows of several files stack:

- `record`: what the row is. `case`: one case of `bench run` (its statistics over repeats); `sample`: one
  timed pass of a case on one rank (`per_sample=True`, instead of the case rows; a case without samples, one
  that failed or was skipped, keeps one row with empty rank, repeat and sample_s); `verify`: one record of
  `bench verify` (RunResult.verifications), always included.
- the run's identity (RUN_COLUMNS): file name, run name, commit, branch, dirty, host, device, torch version,
  threads per rank (the case's own when it recorded them, else the configured ones);
- the case's coordinates (CASE_COLUMNS): scenario, case_id, mode, checkpoint, cp, seq_len, local_seq_len,
  pass, dtype, batch, layout, documents (their tag: `docs64-lognormal`, or `none`) and the layer's dims;
- its measurements (MEASURE_COLUMNS: status, first error line; the case's time, `estimate_s` with its 95%
  interval `low_s` / `high_s` over `rounds` rounds (what every table shows), how many rounds were timed on a
  shared machine and whether all were (`contended`); the statistics of every repeat of every round pooled,
  named as such (`repeats_median_s`, min, max, IQR); peak bytes, model FLOPs, matmul GFLOP/s and achieved
  GFLOP/s per rank at the estimate where the file has a throughput record, wall time), a sample's
  (SAMPLE_COLUMNS: its round, rank and repeat) or a verify record's (VERIFY_COLUMNS: which check, passed,
  its failures, the worst errors);
- what ran and the correctness gate (RAN_COLUMNS: the mode, local path and ops gdn_cp recorded, the first
  pass's time, the gate's bar, small check, cp 1 reference and its distance; empty where not recorded).

A column that does not apply to a row is None (an empty CSV cell, JSON null).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from bench.errors import first_line
from bench.records import to_dict
from bench.results.store import CaseResult, RunResult
from bench.results.verifications import LayerVerification, TrainVerification, Verification
from bench.suite.config import LAYER_KEYS, Case
from bench.suite.documents import documents_tag

Row = dict[str, Any]
Record = Literal["case", "sample", "verify"]

RUN_COLUMNS = (
    *("file", "run", "created_at", "commit", "branch", "dirty", "host"),
    *("device_type", "device_name", "torch_version", "threads_per_rank"),
)
CASE_COLUMNS = (
    *("scenario", "case_id", "mode", "checkpoint", "overlap", "cp", "seq_len", "local_seq_len", "pass"),
    *("dtype", "precision", "batch", "layout", "documents", *LAYER_KEYS),
)
MEASURE_COLUMNS = (
    *("status", "error", "estimate_s", "low_s", "high_s", "rounds", "planned_rounds", "incomplete"),
    *("contended_rounds", "contended"),
    *("repeats_median_s", "repeats_min_s", "repeats_max_s", "repeats_iqr_s", "noisy", "repeats"),
    *("peak_bytes", "model_flops", "matmul_gflops", "achieved_gflops_per_rank", "wall_s"),
)
RAN_COLUMNS = (
    *("ran_mode", "ran_local_path", "ran_ops", "first_use_s"),
    *("check_bar", "check_small_rel_l2", "check_reference", "check_reference_rel_l2"),
)
"""What ran, as gdn_cp recorded it (`ran_ops`: the ops the backend seam called, `module.qualname (backend)`,
joined by "; "; empty: not recorded), the first pass's time (the largest of the rounds', untimed by the
case's figures) and the correctness gate's checks (bench.measure.gate)."""
SAMPLE_COLUMNS = ("round", "rank", "repeat", "sample_s")
VERIFY_COLUMNS = (
    *("check", "passed", "failures", "seeds", "steps"),
    *("worst_rel_l2", "worst_grad_norm_rel", "worst_loss_rel"),
    *("mutants_caught", "mutants_run", "no_power_against"),
)
COLUMNS: tuple[str, ...] = (
    "record",
    *RUN_COLUMNS,
    *CASE_COLUMNS,
    *MEASURE_COLUMNS,
    *RAN_COLUMNS,
    *SAMPLE_COLUMNS,
    *VERIFY_COLUMNS,
)
"""Every row's keys, in this order."""


def _run_cells(run: RunResult, file: str) -> Row:
    e = run.environment
    return {
        "file": file,
        "run": run.name,
        "created_at": run.created_at,
        "commit": e.git_commit,
        "branch": e.git_branch,
        "dirty": e.git_dirty,
        "host": e.hostname,
        "device_type": e.device_type,
        "device_name": e.device_name,
        "torch_version": e.torch_version,
        "threads_per_rank": e.threads_per_rank,
    }


def _case_cells(case: Case) -> Row:
    data = to_dict(case)
    data.update(data.pop("layer"))  # flat columns: hidden_size, ..., and the layer's dtype
    data["documents"] = documents_tag(case.documents)  # one cell: the case id's tag, or none
    return {name: data[name] for name in CASE_COLUMNS}


def measure_cells(result: CaseResult) -> Row:
    """A case's MEASURE_COLUMNS (those it has: a failed case only its status, error and wall time); also
    each side of `bench compare --format json`."""
    t, m, tp, est = result.timing, result.memory, result.throughput, result.estimate
    cells: Row = {
        "status": result.status,
        "error": first_line(result.error) or None,
        "peak_bytes": None if m is None else m.peak_bytes,
        "wall_s": result.wall_s,
    }
    if result.status == "ok":
        cells.update(
            rounds=len(result.rounds),
            planned_rounds=result.case.rounds,
            incomplete=len(result.rounds) < result.case.rounds,  # the run stopped early: a wider interval
            contended_rounds=result.contended_rounds,
            contended=result.contended,
        )
    if est is not None:
        cells.update(estimate_s=est.median_s, low_s=est.low_s, high_s=est.high_s)
    if t is not None:
        cells.update(
            repeats_median_s=t.median_s,
            repeats_min_s=t.min_s,
            repeats_max_s=t.max_s,
            repeats_iqr_s=t.iqr_s,
            noisy=t.noisy,
            repeats=t.repeats,
        )
    if tp is not None:
        cells.update(model_flops=tp.model_flops, matmul_gflops=tp.matmul_gflops)
        if result.seconds is not None:
            cells["achieved_gflops_per_rank"] = tp.achieved_gflops(result.seconds, result.case.cp)
    if result.threads_per_rank is not None:
        cells["threads_per_rank"] = result.threads_per_rank
    return cells | ran_cells(result)


def ran_cells(result: CaseResult) -> Row:
    """A case's RAN_COLUMNS (those it recorded)."""
    cells: Row = {}
    if result.ran:
        call = result.ran[0]
        ops = dict.fromkeys(f"{op.op} ({op.backend})" for c in result.ran for op in c.ops)
        cells.update(ran_mode=call.mode, ran_local_path=call.local_path, ran_ops="; ".join(ops))
    first = [r.first_use_s for r in result.rounds if r.first_use_s is not None]
    if first:
        cells["first_use_s"] = max(first)
    check = result.check
    if check is not None:
        cells.update(check_bar=check.bar, check_reference=check.reference)
        cells["check_reference_rel_l2"] = check.reference_rel_l2
        if check.small is not None:
            cells["check_small_rel_l2"] = check.small.worst()[1]
    return cells


def _verify_cells(record: Verification) -> Row:
    cells: Row = {
        "status": record.status,
        "error": first_line(record.error) or None,
        "wall_s": record.wall_s,
        "check": record.kind,
        "passed": record.passed,
    }
    if isinstance(record, LayerVerification):
        failures = [f"seed {seed}: {f}" for seed, fs in record.failures() for f in fs]
        cells["seeds"] = len(record.seeds)
        if record.comparisons:
            cells["worst_rel_l2"] = max(
                s.rel_l2 for c in record.comparisons for s in (c.output, c.input_grad, *c.params.values())
            )
            cells["worst_grad_norm_rel"] = max(c.grad_norm_rel for c in record.comparisons)
    else:
        assert isinstance(record, TrainVerification)
        failures = record.failures()
        cells["steps"] = record.steps
        cells["worst_grad_norm_rel"] = max(record.grad_norm_rel, default=None)
        cells["worst_loss_rel"] = max(record.loss_rel, default=None)
    cells["failures"] = "; ".join(failures) or None
    power = record.power
    if power:  # the check's power: the mutants of CP it caught (bench.verification)
        cells.update(mutants_caught=sum(v.caught for v in power), mutants_run=len(power))
        cells["no_power_against"] = "; ".join(record.no_power_against) or None
    return cells


def _row(record: Record, *parts: Row) -> Row:
    row: Row = dict.fromkeys(COLUMNS)
    row["record"] = record
    for part in parts:
        row.update(part)
    return row


def export_rows(run: RunResult, file: str = "", *, per_sample: bool = False) -> list[Row]:
    """The rows of one run (see the module docstring): its cases (or with `per_sample` their samples, by
    rank and repeat), then its verify records. `file`: the value of the `file` column (the file's name)."""
    ident = _run_cells(run, file)
    rows: list[Row] = []
    for result in run.cases:
        parts = (ident, _case_cells(result.case), measure_cells(result))
        if not per_sample or not result.samples_s:
            rows.append(_row("sample" if per_sample else "case", *parts))
            continue
        for number, round_ in enumerate(result.rounds):
            for rank, samples in enumerate(round_.samples_s):
                for repeat, seconds in enumerate(samples):
                    sample = {"round": number, "rank": rank, "repeat": repeat, "sample_s": seconds}
                    rows.append(_row("sample", *parts, sample))
    for record in run.verifications:
        rows.append(_row("verify", ident, _case_cells(record.case), _verify_cells(record)))
    return rows


def to_csv(rows: Iterable[Row]) -> str:
    """CSV text with a header of COLUMNS (None: an empty cell; booleans True/False)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def to_jsonl(rows: Iterable[Row]) -> str:
    """JSON Lines: one object per row, keys in COLUMNS order."""
    return "".join(json.dumps(row) + "\n" for row in rows)


FORMATS: dict[str, Callable[[Sequence[Row]], str]] = {"csv": to_csv, "jsonl": to_jsonl}
"""`bench export --format` -> how rows become text."""
