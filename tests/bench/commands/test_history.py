"""`bench history`: change points of a case's time across commits (bench.judge.changepoints), the
histories read from result files (bench.results.history loads, bench.judge.history judges), the files under
a folder that are not result files skipped with one note, the changes as a table and as a site, and the CI
exit code. Histories here are synthetic: known steps in lognormal round medians of a fixed seed."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest
from histories import commit_runs, round_medians
from rich.console import Console

from bench.commands import compare as compare_command
from bench.commands import history as history_command
from bench.commands.history import load_history
from bench.errors import UserError
from bench.judge.changepoints import change_points
from bench.judge.history import regressions_at_newest
from bench.results.store import load_result, save_result


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
    with pytest.raises(UserError, match="no result file under"):
        load_history([tmp_path])
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(
        UserError, match=r"no result file under .* \(1 JSON files there are not result files\)"
    ):
        load_history([tmp_path])


def _profile(folder: Path) -> list[Path]:
    """A `bench profile` folder under `folder` (results/profiles/...): a trace per rank and a summary, JSON
    files that are not result files."""
    profile = folder / "profiles" / "20261201-main-1a38a701-tiny-p2p"
    profile.mkdir(parents=True)
    files = [profile / "rank0.json", profile / "rank1.json", profile / "summary.json"]
    for path in files[:2]:
        path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "aten::mm"}]}))
    files[2].write_text(json.dumps({"case": "tiny/p2p-cp2-T64-fwd", "steps": 3}))
    return files


def test_files_that_are_not_result_files_are_skipped_with_one_note(tmp_path: Path):
    """Issue 50: `bench history results` stopped at results/profiles/.../rank0.json ("schema_version None
    ... re-run its scenarios"): a trace is not a result file. Skipped, all of them named in one note."""
    folder = commit_runs(tmp_path, [1.0] * 7 + [1.3])
    traces = _profile(folder)
    console, out = _console()
    code = history_command.run([str(folder)], fmt="table", fail_on_regression=True, console=console)
    text = out.getvalue()
    assert code == history_command.EXIT_REGRESSION, text  # the history itself as without the traces
    notes = [line for line in text.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "skipped 3 JSON files that are not result files" in " ".join(text.split())
    assert str(traces[0]) in " ".join(text.split())
    (h,) = load_history([folder])
    assert len(h.runs) == 8


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            json.dumps({"schema_version": 99, "name": "x"}),
            "schema_version 99 is not a version this bench reads",
        ),
        ('{\n "schema_version": 6,\n "name": "cut sh', r"8.json:3: not valid JSON"),
    ],
    ids=["newer schema", "cut short"],
)
def test_a_result_file_it_cannot_read_still_stops_it(tmp_path: Path, text, message):
    folder = commit_runs(tmp_path, [1.0] * 3)
    _profile(folder)
    (folder / "8.json").write_text(text)
    with pytest.raises(UserError, match=message):
        history_command.run([str(folder)], fmt="table", console=_console()[0])


def _warmup(folder: Path, runs: range, warmup: int) -> None:
    """The result files `runs` of a commit_runs folder, their cases' warmup set to `warmup`."""
    for i in runs:
        path = folder / f"{i}.json"
        run = load_result(path)
        cases = [dataclasses.replace(c, case=dataclasses.replace(c.case, warmup=warmup)) for c in run.cases]
        path.unlink()
        save_result(dataclasses.replace(run, cases=cases), path)


def test_history_and_compare_agree_on_what_is_comparable(tmp_path: Path):
    """Issue 46: `bench compare` of the two committed cpu-scaling runs called every case not comparable
    (warmup 3 vs 2) while `bench history` of the same files found 8 faster. One rule now: a step across
    runs that are not comparable is not looked for, both say why and which flag lifts it, and with --force
    both compare."""
    folder = commit_runs(tmp_path, [1.0] * 4 + [1.3] * 4)
    _warmup(folder, range(4, 8), warmup=3)
    (h,) = load_history([folder])
    assert all(not case.changes for case in h.cases)
    (brk,) = h.breaks
    assert brk.index == 4 and "warmup 1 vs 3" in brk.reason
    console, out = _console()
    assert history_command.run([str(folder)], fmt="table", console=console) == 0
    history_text = " ".join(out.getvalue().split())
    assert f"not comparable at 04cccccc (no change is looked for across it), {len(brk.keys)} cases" in (
        history_text
    )
    assert "warmup 1 vs 3); --force compares them anyway" in history_text
    console, out = _console()
    compare_command.run(str(folder / "3.json"), str(folder / "4.json"), console=console)
    compare_text = " ".join(out.getvalue().split())
    assert (
        f"not comparable, {len(brk.keys)} cases: {brk.reason}; --force compares them anyway" in compare_text
    )
    site = tmp_path / "site"
    history_command.run([str(folder)], out=str(site), console=_console()[0])
    index = " ".join((site / "index.html").read_text().split())
    assert "not comparable at 04cccccc (no change is looked for across it)" in index
    # forced, both compare: the step at commit 4 is found again
    (forced,) = load_history([folder], force=True)
    assert not forced.breaks and any(c.changes for c in forced.cases)
    console, out = _console()
    compare_command.run(str(folder / "3.json"), str(folder / "4.json"), force=True, console=console)
    assert "worse (forced)" in out.getvalue() and "0 not comparable" in out.getvalue()
