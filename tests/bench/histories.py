"""Synthetic histories for the `bench history` tests: round medians with known steps, and folders of result
files, one per commit (the ablation fixture's cases at those levels), as a backfill writes them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from bench.measure.statistics import estimate
from bench.results.history import FAILED_SUFFIX
from bench.results.store import RoundResult, load_result, save_result

FIXTURES = Path(__file__).parent / "fixtures"
SD = 0.10
"""Spread of the log round medians: this VM's lifetimes differ by about 13% between pools."""
QUIET_SD = 0.04
"""The result-file histories' spread: a quiet machine, so that what they test is where a step is placed and
how it is shown (how small a step the noise lets through is the change-point tests' subject)."""


def round_medians(levels: list[float], rounds: int = 6, seed: int = 0, sd: float = SD) -> list[list[float]]:
    """Round medians (s) of one run per level, lognormal around 50 ms x the level."""
    rng = np.random.default_rng(seed)
    return [list(0.05 * level * np.exp(rng.normal(0.0, sd, rounds))) for level in levels]


def commit_runs(tmp_path: Path, levels: list[float], *, failed: int | None = None) -> Path:
    """A folder of result files, one per commit (the ablation fixture's cases, 6 rounds each at `levels`
    x their time), commit i dated day i; commit `failed` as a backfill's failure record instead."""
    base = load_result(FIXTURES / "ablation.json")
    folder = tmp_path / "history"
    folder.mkdir()
    for i, level in enumerate(levels):
        commit = f"{i:02d}" + "c" * 38
        date = f"2026-11-{i + 1:02d}T10:00:00+00:00"
        if i == failed:
            record = {"name": "tiny-ablation", "commit": commit, "date": date, "subject": f"commit {i}"}
            record |= {"created_at": date, "error": "its bench cannot run round 1 (exit 1: ImportError)"}
            (folder / f"{commit[:12]}{FAILED_SUFFIX}").write_text(json.dumps(record))
            continue
        env = dataclasses.replace(
            base.environment, git_commit=commit, git_date=date, git_subject=f"commit {i}"
        )
        cases = []
        for j, result in enumerate(base.cases):
            if result.status != "ok":
                cases.append(result)
                continue
            t = result.estimate.median_s * (level if "fwd_bwd" not in result.key else 1.0)
            medians = round_medians([1.0], seed=100 * i + j, sd=QUIET_SD)[0]
            rounds = [RoundResult(samples_s=[[t / 0.05 * m]] * result.case.cp) for m in medians]
            est = estimate([r.median_s for r in rounds])
            cases.append(dataclasses.replace(result, rounds=rounds, estimate=est))
        save_result(
            dataclasses.replace(base, environment=env, cases=cases, created_at=date), folder / f"{i}.json"
        )
    return folder
