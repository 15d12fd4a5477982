"""Result files of older schema versions, converted on reading into the current layout (plain dicts).

Version 1 (one launch per case): a case's `samples_s` [rank][repeat] and `contention` become its one round
(position 0, started when the case finished: version 1 recorded no start), and `rounds: 1` is what its
case and suite ran with; its estimate is that round's median, without an interval (one round shows no
variance between process lifetimes, so `bench compare` gives such cases no verdict). Everything else is
as version 1 wrote it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bench.measure.timing import rank_max
from bench.results.statistics import estimate

UPGRADES = {1: "the samples of each case become its one round"}
"""Versions this module converts, and what converting them does."""


def _case_v1(case: dict[str, Any]) -> dict[str, Any]:
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
            median = float(np.median(rank_max(samples)))
            out["estimate"] = dataclasses.asdict(estimate([median]))
    return out


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A result file's contents in the current layout; `data` of a version in UPGRADES (else unchanged).
    KeyError / TypeError / ValueError on a malformed file (load_result turns them into one line)."""
    if data.get("schema_version") != 1:
        return data
    out = dict(data)
    out["cases"] = [_case_v1(c) for c in data["cases"]]
    out["suite"] = {**data["suite"], "rounds": 1}
    out["schema_version"] = 2
    out.setdefault("schedule_seed", None)
    out.setdefault("session", None)
    return out
