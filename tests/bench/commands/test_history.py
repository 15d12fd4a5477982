"""`bench history`: change points of a case's time across commits (bench.judge.changepoints), the
histories read from result files (bench.judge.history), the changes as a table and as a site, and the CI
exit code. Histories here are synthetic: known steps in lognormal round medians of a fixed seed."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from histories import commit_runs, round_medians
from rich.console import Console

from bench.commands import history as history_command
from bench.judge.changepoints import change_points
from bench.judge.history import load_history, regressions_at_newest


def test_a_step_is_found_where_it_starts_and_nowhere_else():
    runs = round_medians([1.0] * 4 + [1.3] * 4)
    (step,) = change_points(runs, factor=1.10, alpha=0.05)
    assert step.index == 4 and step.verdict == "worse"
    assert step.ratio.low is not None and 1.10 < step.ratio.low < 1.3 < step.ratio.high
    (faster,) = change_points(round_medians([1.0] * 5 + [0.7] * 3, seed=1), factor=1.10, alpha=0.05)
    assert faster.index == 5 and faster.verdict == "better"


def test_two_steps_are_both_found():
    runs = round_medians([1.0] * 4 + [1.4] * 4 + [1.0] * 4, seed=2)
    assert [(s.index, s.verdict) for s in change_points(runs, factor=1.10, alpha=0.05)] == [
        (4, "worse"),
        (8, "better"),
    ]


@pytest.mark.parametrize("seed", range(20))
def test_runs_of_one_level_give_no_change_point(seed):
    """Eight runs of one commit: a false alarm needs a 10% step beyond a Bonferroni-corrected interval."""
    assert change_points(round_medians([1.0] * 8, seed=seed), factor=1.10, alpha=0.05) == []


def test_drift_between_runs_is_not_a_step():
    """Each run's level wanders by 8% (the machine between runs) beyond its rounds' spread: the runs are
    judged with that drift, so no step is called where there is none."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        levels = list(np.exp(rng.normal(0.0, 0.08, 8)))
        assert (
            change_points(
                round_medians(levels, seed=int(rng.integers(1000)), sd=0.05), factor=1.10, alpha=0.05
            )
            == []
        )


def test_histories_of_result_files_place_the_step_at_its_commit(tmp_path: Path):
    """Commit 5 of 8 makes the forward 1.3x slower: every forward case steps there, fwd_bwd none."""
    folder = commit_runs(tmp_path, [1.0] * 4 + [1.3] * 4)
    (h,) = load_history([folder])
    assert h.scenario == "tiny-ablation" and [r.commit.subject for r in h.runs] == [
        f"commit {i}" for i in range(8)
    ]
    for case in h.cases:
        measured = any(r is not None for r in case.results)  # the fixture has a failed case
        expected = [(4, "worse")] if case.key.endswith("-fwd") and measured else []
        assert [(c.index, c.verdict) for c in case.changes] == expected, case.key
    assert [c.key for c in h.cases if c.changes] and not regressions_at_newest([h])


def test_a_failed_commit_is_kept_in_its_place(tmp_path: Path):
    folder = commit_runs(tmp_path, [1.0] * 3 + [1.3] * 3, failed=4)
    (h,) = load_history([folder])
    assert [r.run is None for r in h.runs] == [False] * 4 + [True, False]
    assert "ImportError" in h.runs[4].error and all(c.results[4] is None for c in h.cases)


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=80, color_system=None), out


def test_the_table_fits_80_columns_and_the_newest_step_fails_ci(tmp_path: Path):
    folder = commit_runs(tmp_path, [1.0] * 7 + [1.3])
    console, out = _console()
    code = history_command.run([str(folder)], fmt="table", fail_on_regression=True, console=console)
    text = out.getvalue()
    assert code == history_command.EXIT_REGRESSION, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "07cccccc" in text and "slower" in text and "regression at the newest commit 07cccccc" in text
    console, out = _console()
    assert history_command.run([str(folder)], fmt="table", console=console) == 0  # reported, not failed


def test_the_site_has_an_index_and_a_page_per_scenario(tmp_path: Path):
    folder = commit_runs(tmp_path, [1.0] * 4 + [1.3] * 4, failed=2)
    site = tmp_path / "site"
    console, _ = _console()
    assert history_command.run([str(folder)], out=str(site), console=console) == 0
    pages = sorted(p.name for p in site.iterdir())
    assert pages[0] == "index.html" and len(pages) == 2 and pages[1].startswith("tiny-ablation--")
    index = (site / "index.html").read_text()
    assert f'href="{pages[1]}"' in index and "04cccccc" in index and "slower" in index
    assert "commits whose bench could not run: 02cccccc" in index
    page = (site / pages[1]).read_text()
    cases = len(load_history([folder])[0].cases)
    assert page.count("<img ") == cases and page.count("change starts here") == cases
    with pytest.raises(Exception, match="not an empty folder"):
        history_command.run([str(folder)], out=str(site), console=console)


def test_no_result_file_is_one_clear_error(tmp_path: Path):
    with pytest.raises(Exception, match="no result file under"):
        load_history([tmp_path])
