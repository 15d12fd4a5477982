"""The fault-injection soak (tests/bench/soak.py, issue 50) at a size CI affords: a backend that fails at
random, a rank SIGKILLed, the results folder read-only for a while, and `--resume` until the sweep ends:
nothing measured twice, nothing lost, the file valid after every run, no process left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import soak

pytestmark = pytest.mark.multirank


def test_a_small_soak_loses_nothing_and_measures_nothing_twice(tmp_path: Path):
    report = soak.soak(tmp_path, cases=16, kills=1, read_only_s=8, window_s=20, seed=1)
    assert report.problems == []
    assert report.runs[-1] in (0, 2) and len(report.runs) >= 2, report.runs  # the read-only stop, a resume
    assert report.read_only_stops >= 1
    assert report.ok + report.failed == 16 and report.ok > 0
