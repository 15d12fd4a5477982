"""The history of the result file format, in one place, and the conversions that read older files.

Every version's layout is what the records of its time declared (bench/results/store.py now). A file of an
older version is converted step by step, as plain JSON data, into the current layout before it is read:

- 1: one launch per case: a case's samples [rank][repeat] (`samples_s`) and contention sit on the case.
- 2: rounds (separate lifetimes of the ranks, bench.launch.pool): a case's samples become its rounds, with
  an estimate over them and a 95% interval. Keys were added inside version 2 that files written before
  them lack; each one absent meant what `ADDED_IN_2` gives (the value those runs had).
- 3: one declaration per record (bench.records): a case's layer sizes and dtype nest as the case's `layer`
  (gdn_cp.GatedDeltaNetConfig, with rms_norm_eps), a case is `case` in a case result and a verify record
  (was `params`), every key is written; derived values no longer written: a layer comparison's
  grad_norm_rel and a verify record's failures (both recomputed from the stored numbers; `passed` stays).
- 4: the environment records the commit's date and subject (`git_date`, `git_subject`: where a run sits in
  `bench history`); null in older files.
- 5: paired measurement (`bench compare REF REF` times both refs' layers in one lifetime of the ranks): a
  round records the lifetime it ran in (`lifetime`, which the two sides of a paired round share) and a run
  the commit of the bench that measured it when that is not the measured code's own (`measured_by`); null
  in older files.
- 6: local-op backends (gdn_cp.ops.backends): a case's layer records its `backend` (the project's own op,
  "gdn_cp", before) and the environment, and each of its nodes, the backends' package versions
  (`kernel_versions`; empty, unknown, before); a device's memory reading adds the allocator's reserved peak
  and the device's used memory before the pass (`reserved_peak_bytes`, `device_used_before_bytes`; null
  before, when the allocator's cache was not released first either).
- 7: what ran and the correctness gate (bench.measure.gate): a case records what its first pass ran, as gdn_cp
  itself recorded it (`ran`: the mode, its options as applied, the local path, the ops the backend seam
  called), the gate's reference checks (`check`: fingerprints of its results, the small check against the
  fp64 single-device layer, the cp 1 case it was compared with), and each round the wall time of its first
  pass (`first_use_s`, a backend's compiles and autotuning); a verify record what its model ran (`ran`).
  Null in older files: "ran: not recorded", no check, first use unknown. Checks with power: a layer record
  says how its comparisons drew their inputs (`inputs`: "random", the reference PR's, before), holds the
  same inputs packed across rank edges (`packed`), the PR's inputs beside them (`reproduction`) and its runs
  with CP broken on purpose (`mutants`), a comparison the share of each rank's output its entering state
  carries (`state_share`); a trajectory its first step on "state" inputs (`first`) and its `mutants`. Empty
  or null in older files: no power measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

SCHEMA_VERSION = 7
"""The version `bench run` writes. Bump it when the layout changes, add a line above and a step below."""

Data = dict[str, Any]

ADDED_IN_2: dict[str, dict[str, Any]] = {
    "run": {"verifications": [], "command": None, "schedule_seed": None, "session": None},
    "case result": {"throughput": None, "contention": None},
    "case": {
        "dtype_in_id": False,
        "layout": "contiguous",
        "documents": None,
        "rounds": 1,
        "overlap": False,
        "precision": "fp32",
    },
    "contention": {"window": None, "earlier": 0},
    "environment": {"nodes": None},
    "throughput": {"matmul_dtype": None},
    "memory": {"device_used_bytes": None},
}
"""Keys added while the format was version 2, by the record that holds them: what a missing one meant."""

LAYER_KEYS_2 = ("hidden_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")
LAYER_KEYS_2 += ("conv_kernel_size", "chunk_size", "dtype")
"""The layer's keys of a version-2 case, flat among its other keys."""


V2_ESTIMATE_METHOD = "geometric mean of round medians, Student t interval on their logarithms"
"""How version 2 named its estimate. A version-1 case becomes one round, whose estimate is that round's
median with no interval; the arithmetic is written out here, frozen, so that a later change to the live
statistics (bench.measure.statistics, bench.measure.timing) never changes how an old file reads."""


def _v1_estimate(samples: list[list[float]]) -> Data:
    """The version-2 estimate of one round of [rank][repeat] samples: the median over repeats of the
    slowest rank, no interval."""
    median = float(np.median(np.max(np.asarray(samples, dtype=float), axis=0)))
    return {
        "median_s": median,
        "low_s": None,
        "high_s": None,
        "rounds": 1,
        "confidence": 0.95,
        "method": V2_ESTIMATE_METHOD,
    }


def _v1_case(case: Data) -> Data:
    out = {k: v for k, v in case.items() if k != "samples_s"}
    out["params"] = {**case["params"], "rounds": 1}
    samples = case.get("samples_s")
    out["rounds"] = []
    out["estimate"] = None
    if samples:
        out["rounds"] = [
            {
                "samples_s": samples,
                "contention": case.get("contention"),
                "wall_s": case["wall_s"],
                "position": 0,
                "started_at": case["finished_at"],
            }
        ]
        if case["status"] == "ok":
            out["estimate"] = _v1_estimate(samples)
    return out


def _from_1(data: Data) -> Data:
    """Version 1 -> 2: a case's samples become its one round (started when the case finished: version 1
    recorded no start), and `rounds: 1` is what its case and suite ran with; its estimate is that round's
    median, without an interval (one round shows no variance between process lifetimes, so `bench compare`
    gives such cases no verdict)."""
    return {**data, "cases": [_v1_case(c) for c in data["cases"]], "suite": {**data["suite"], "rounds": 1}}


def _filled(record: Data | None, kind: str) -> Data | None:
    return None if record is None else {**ADDED_IN_2[kind], **record}


def _v2_case(params: Data) -> Data:
    case = _filled(params, "case")
    assert case is not None
    case["layer"] = {k: case.pop(k) for k in LAYER_KEYS_2}
    return case


def _v2_case_result(result: Data) -> Data:
    out = _filled(result, "case result")
    assert out is not None
    out["case"] = _v2_case(out.pop("params"))
    out["contention"] = _filled(out["contention"], "contention")
    out["rounds"] = [{**r, "contention": _filled(r["contention"], "contention")} for r in out["rounds"]]
    out["memory"] = _filled(out["memory"], "memory")
    out["throughput"] = _filled(out["throughput"], "throughput")
    return out


def _v2_verification(record: Data) -> Data:
    out = {k: v for k, v in record.items() if k != "failures"}
    out["case"] = _v2_case(out.pop("params"))
    if "comparisons" in out:
        out["comparisons"] = [
            {k: v for k, v in c.items() if k != "grad_norm_rel"} for c in out["comparisons"]
        ]
    return out


def _from_2(data: Data) -> Data:
    """Version 2 -> 3 (module docstring)."""
    out = _filled(data, "run")
    assert out is not None
    environment = _filled(out["environment"], "environment")
    assert environment is not None
    out["environment"] = environment
    out["cases"] = [_v2_case_result(c) for c in out["cases"]]
    out["verifications"] = [_v2_verification(v) for v in out["verifications"]]
    return out


def _from_3(data: Data) -> Data:
    """Version 3 -> 4 (module docstring)."""
    return {**data, "environment": {"git_date": None, "git_subject": None, **data["environment"]}}


def _from_4(data: Data) -> Data:
    """Version 4 -> 5 (module docstring)."""
    cases = [{**case, "rounds": [{"lifetime": None, **r} for r in case["rounds"]]} for case in data["cases"]]
    return {"measured_by": None, **data, "cases": cases}


def _from_5(data: Data) -> Data:
    """Version 5 -> 6 (module docstring)."""

    def case(record: Data) -> Data:
        layer = {"backend": "gdn_cp", **record["case"]["layer"]}
        out = {**record, "case": {**record["case"], "layer": layer}}
        if out.get("memory") is not None:
            out["memory"] = {"reserved_peak_bytes": None, "device_used_before_bytes": None, **out["memory"]}
        return out

    environment = {"kernel_versions": {}, **data["environment"]}
    if environment.get("nodes"):
        environment["nodes"] = [{"kernel_versions": {}, **node} for node in environment["nodes"]]
    return {
        **data,
        "environment": environment,
        "cases": [case(c) for c in data["cases"]],
        "verifications": [case(v) for v in data["verifications"]],
    }


def _from_6(data: Data) -> Data:
    """Version 6 -> 7 (module docstring)."""

    def case(record: Data) -> Data:
        rounds = [{"first_use_s": None, **r} for r in record["rounds"]]
        return {"ran": None, "check": None, **record, "rounds": rounds}

    def verification(record: Data) -> Data:
        if record.get("kind") != "layer":
            return {"ran": None, "first": None, "mutants": [], **record}
        comparisons = [{"state_share": [], **c} for c in record.get("comparisons", [])]
        extra = {"inputs": "random", "packed": [], "reproduction": [], "mutants": []}
        return {**extra, **record, "comparisons": comparisons}

    verifications = [verification(v) for v in data["verifications"]]
    return {**data, "cases": [case(c) for c in data["cases"]], "verifications": verifications}


STEPS: dict[int, tuple[str, Callable[[Data], Data]]] = {
    1: ("the samples of each case become its one round", _from_1),
    2: ("the layer nests in its case, keys added inside version 2 get the values they meant", _from_2),
    3: ("the environment gets the commit's date and subject, unknown", _from_3),
    4: ("rounds get their lifetime and runs the bench that measured them, unknown", _from_4),
    5: ("layers get the project's own backend, environments unknown kernel versions", _from_5),
    6: ("cases get what ran and the gate's checks, not recorded; rounds an unknown first use", _from_6),
}
"""Version -> (what converting it does, the step to the next version)."""

UPGRADES = {version: summary for version, (summary, _) in STEPS.items()}
"""Versions this module converts, and what converting them does."""


def upgrade(data: Data) -> Data:
    """A result file's contents in the current layout (SCHEMA_VERSION); `data` of a version in STEPS (else
    unchanged). KeyError / TypeError / ValueError on a malformed file (load_result turns them into one
    line)."""
    version = data.get("schema_version")
    while version in STEPS:
        data = {**STEPS[version][1](data), "schema_version": version + 1}
        version += 1
    return data
