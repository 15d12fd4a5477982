"""Frozen one-round result files made into several rounds, so that `bench compare` can judge them.

The fixtures were written with one round per case (schema 1), and one round gets no interval ("too
noisy"). Each ok case's round is repeated with its times scaled by ROUND_SCALES: the same case measured
in three process lifetimes, a spread far inside any factor, so that two copies compare as "~".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.results.store import CaseResult, RunResult, load_result, save_result

ROUND_SCALES = (0.999, 1.0, 1.001)


def _in_rounds(result: CaseResult) -> CaseResult:
    if result.status != "ok" or not result.rounds:
        return result
    first = result.rounds[0]
    rounds = [
        dataclasses.replace(first, samples_s=[[x * f for x in rank] for rank in first.samples_s])
        for f in ROUND_SCALES
    ]
    return dataclasses.replace(result, rounds=rounds)


def in_rounds(run: RunResult) -> RunResult:
    """`run` with every ok case in len(ROUND_SCALES) rounds."""
    return dataclasses.replace(run, cases=[_in_rounds(c) for c in run.cases])


def saved_in_rounds(path: Path, out: Path) -> Path:
    """The result file at `path` in rounds, written to `out`."""
    save_result(in_rounds(load_result(path)), out)
    return out
