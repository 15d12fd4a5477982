"""`bench gate`: one exit code from timing verdicts and head's accuracy checks, on the frozen fixtures with
known changes applied (slower samples, bars no check can meet, another machine), unknown verdict states,
bad input, and the git-ref route through `bench compare`."""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from bench.cli import main
from bench.commands import gate as gate_command
from bench.commands.session import CaseChoice
from bench.formats import format_time
from bench.judge.comparison import compare_runs
from bench.judge.gate import GateResult, check_state, gate
from bench.launch.ref_rounds import SidePaths
from bench.measure.statistics import Estimate
from bench.render.gate import accuracy_table, timing_table
from bench.results.store import RunResult, load_result, save_result
from bench.results.verifications import LayerMutant
from tests.bench.multiround import in_rounds

FIXTURES = Path(__file__).parents[1] / "fixtures"
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115
REPO = Path(__file__).resolve().parents[3]


def timing_run(*, failed: str | None = None, **env) -> RunResult:
    """The ablation fixture in three rounds (two copies: every comparable case "~"); `failed`: that case
    id failed."""
    run = in_rounds(load_result(FIXTURES / "ablation.json"))
    cases = [
        dataclasses.replace(c, status="failed", error="RuntimeError: boom") if c.case.case_id == failed else c
        for c in run.cases
    ]
    return dataclasses.replace(run, cases=cases, environment=dataclasses.replace(run.environment, **env))


def with_verdict(result: GateResult, verdict: str, index: int | None = None) -> GateResult:
    """The gate with one case's verdict (every case's: index None) replaced by `verdict`."""
    cases = result.comparison.cases
    result.comparison.cases = [
        dataclasses.replace(c, verdict=verdict) if index in (None, i) else c for i, c in enumerate(cases)
    ]
    return result


def verify_run(*, exact: bool = True) -> RunResult:
    """The verify fixture; exact=False: its first check held to bars of 1e-30, which its errors exceed."""
    run = load_result(FIXTURES / "verify.json")
    if not exact:
        first = run.verifications[0]
        bars = {k: 1e-30 for k in first.thresholds}
        run.verifications[0] = dataclasses.replace(first, thresholds=bars)
    return run


def files(tmp_path: Path, base: RunResult, head: RunResult, verify: RunResult) -> list[str]:
    paths = [tmp_path / "base.json", tmp_path / "head.json", tmp_path / "verify.json"]
    for run, path in zip((base, head, verify), paths, strict=True):
        save_result(run, path)
    return [str(p) for p in paths]


def outcome(base: RunResult, head: RunResult, verify: RunResult) -> GateResult:
    return gate(compare_runs(base, head), [], verify.verifications)


def test_a_change_that_is_as_fast_and_exact_passes(tmp_path, capsys):
    base, head = timing_run(), timing_run(git_commit="b" * 40)
    result = outcome(base, head, verify_run())
    assert result.outcome == "pass" and result.judged == len(result.comparison.cases) > 0
    assert result.checked == 3 and not result.slower and not result.inexact
    b, h, v = files(tmp_path, base, head, verify_run())
    assert main(["gate", b, h, "--verify", v]) == 0
    out = capsys.readouterr().out
    assert "gate: pass" in out and "(exit 0)" in out and "accuracy: bench verify, layer/tiny-ablation" in out


def test_slower_inexact_and_both_have_their_own_codes(tmp_path):
    worse = with_verdict(outcome(timing_run(), timing_run(), verify_run()), "worse", index=1)
    assert worse.slower == [worse.comparison.cases[1].key] and worse.outcome == "slower"
    inexact = outcome(timing_run(), timing_run(), verify_run(exact=False))
    assert inexact.outcome == "inexact" and inexact.inexact == [verify_run().verifications[0].key]
    both = with_verdict(outcome(timing_run(), timing_run(), verify_run(exact=False)), "worse", index=0)
    assert both.outcome == "slower and inexact"
    failed = timing_run(failed="p2p-ckpt-cp2-T64-fwd_bwd")  # ok on base, failed on head: slower
    for head, verify, code in ((failed, verify_run(), 3), (timing_run(), verify_run(exact=False), 4)):
        b, h, v = files(tmp_path, timing_run(), head, verify)
        assert gate_command.run(b, h, verify=[v], console=QUIET) == code
    b, h, v = files(tmp_path, timing_run(), failed, verify_run(exact=False))
    assert gate_command.run(b, h, verify=[v], console=QUIET) == 5
    assert gate_command.EXIT_CODES == {
        "pass": 0,
        "slower": 3,
        "inexact": 4,
        "slower and inexact": 5,
        "nothing compared": 6,
    }


def test_a_case_failed_on_head_is_slower_and_a_check_not_run_is_inexact():
    head = timing_run(failed="ulysses-cp1-T64-fwd")
    verify = verify_run()
    verify.verifications[1] = dataclasses.replace(verify.verifications[1], status="failed", error="died")
    result = outcome(timing_run(), head, verify)
    assert result.slower == ["tiny-ablation/ulysses-cp1-T64-fwd"]
    assert result.inexact == [verify.verifications[1].key]
    assert [row[-1] for row in accuracy_table(result).rows][1] == "died"
    assert ["ulysses-cp1-T64-fwd", "ok", "failed", "", "failed on head"] in timing_table(result).rows


def test_nothing_compared_does_not_pass(tmp_path):
    other_machine = timing_run(cpu_count=64)  # every case "not comparable": no verdict
    result = outcome(timing_run(), other_machine, verify_run())
    assert result.judged == 0 and result.unjudged == {"not comparable": len(result.comparison.cases)}
    assert result.outcome == "nothing compared"
    skipped = verify_run()
    skipped.verifications = [dataclasses.replace(r, status="skipped") for r in skipped.verifications]
    assert outcome(timing_run(), timing_run(), skipped).outcome == "nothing compared"
    out = io.StringIO()
    assert (
        gate_command.run(
            *files(tmp_path, timing_run(), other_machine, verify_run())[:2],
            verify=[str(tmp_path / "verify.json")],
            console=Console(file=out, width=200),
        )
        == 6
    )
    # issue 46: the not comparable cases say why, and which flag of bench compare compares them anyway
    n = len(result.comparison.cases)
    assert f"not comparable, {n} cases: different machine (cpu_count 2 vs 64); `bench compare --force`" in (
        out.getvalue()
    )


def test_unknown_verdict_states_are_neither_pass_nor_fail():
    result = with_verdict(outcome(timing_run(), timing_run(), verify_run()), "too noisy")
    assert result.judged == 0 and not result.slower and result.outcome == "nothing compared"
    with_verdict(result, "~", index=0)
    assert result.outcome == "pass" and "too noisy: no verdict" in result.summary()
    assert [r[-1] for r in timing_table(result).rows][1] == "too noisy"


def test_check_states_read_plainly():
    records = verify_run(exact=False).verifications
    assert [check_state(r) for r in records] == ["FAIL", "pass", "pass"] and check_state(None) == "-"


def test_a_check_without_power_is_counted_apart_never_as_a_pass():
    """Issue 48: a check that passed while a mutant of CP went through proved nothing: the gate reads it as
    "pass, no power", counts it apart, and passes nothing on it alone."""
    run = verify_run()
    first = run.verifications[0]
    unbroken = first.comparisons[0]
    blind = dataclasses.replace(first, mutants=[LayerMutant(name="state_dropped", comparison=unbroken)])
    assert blind.passed and blind.no_power_against
    result = gate(compare_runs(timing_run(), timing_run()), [], [blind])
    assert check_state(blind) == "pass, no power"
    assert result.checked == 0 and result.powerless == [blind.key] and result.outcome == "nothing compared"
    assert "1 passed without power: not counted" in result.summary()


def test_bad_input_is_a_user_error(tmp_path, capsys):
    b, h, v = files(tmp_path, timing_run(), timing_run(), verify_run())
    assert main(["gate", b, h]) == 1
    assert "give head's accuracy checks with --verify FILE" in capsys.readouterr().err
    assert main(["gate", b, v, "--verify", v]) == 1
    assert (
        "not a timing run (it holds `bench verify` checks: give it with --verify)" in capsys.readouterr().err
    )
    assert main(["gate", b, h, "--verify", h]) == 1
    assert "--verify " + h + ": not a `bench verify` file (timing cases" in capsys.readouterr().err
    assert main(["gate", b, str(tmp_path / "missing.json"), "--verify", v]) == 1


def test_a_missing_side_is_named_before_the_missing_verify(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git checkout
    b, _, _ = files(tmp_path, timing_run(), timing_run(), verify_run())
    assert main(["gate", "missing.json", b]) == 1
    err = capsys.readouterr().err
    assert "missing.json: no such result file, and not a git ref either" in err and "--verify" not in err


def test_a_verify_file_of_another_commit_is_warned_about(tmp_path, capsys):
    verify = verify_run()
    commit = verify.environment.git_commit
    b, h, v = files(tmp_path, timing_run(git_commit=commit), timing_run(git_commit=commit), verify)
    assert main(["gate", b, h, "--verify", v]) == 0
    assert "warning" not in capsys.readouterr().err
    b, h, v = files(tmp_path, timing_run(), timing_run(git_commit="b" * 40), verify)
    assert main(["gate", b, h, "--verify", v]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"warning: --verify {v}: its checks ran at commit {commit[:12]}, but head's timings at bbbbbbbbbbbb"
        in err
    )


def test_filter_narrows_both_timing_and_checks(tmp_path):
    b, h, v = files(tmp_path, timing_run(), timing_run(), verify_run(exact=False))
    # the failing check is ulysses'; narrowed to p2p the change passes
    assert gate_command.run(b, h, CaseChoice(filters=["mode=p2p"]), verify=[v], console=QUIET) == 0
    assert gate_command.run(b, h, CaseChoice(filters=["mode=ulysses"]), verify=[v], console=QUIET) == 4


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the project's git checkout")
def test_refs_run_through_bench_compare(tmp_path, monkeypatch):
    b, h, v = files(tmp_path, timing_run(), timing_run(), verify_run())
    seen = {}

    def fake_compared_files(sides, choice, *, save_dir, **kwargs):
        """What `bench compare`'s runs of two refs return: both sides' files, saved in the folder."""
        seen.update(commits=[s.commit for s in sides], scenarios=list(choice.scenarios), save_dir=save_dir)
        base_copy = Path(shutil.copy(b, Path(save_dir) / "base-x.json"))
        return SidePaths([base_copy, Path(shutil.copy(h, Path(save_dir) / "head-x.json"))])

    monkeypatch.setattr(gate_command, "compared_files", fake_compared_files)
    monkeypatch.chdir(REPO)
    code = gate_command.run(
        "HEAD", "HEAD", CaseChoice(["tiny"]), verify=[v], save_dir=str(tmp_path), console=QUIET
    )
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    assert code == 0 and seen == {"commits": [head, head], "scenarios": ["tiny"], "save_dir": str(tmp_path)}


def test_a_budget_reaches_compare_and_its_alpha_judges(tmp_path, monkeypatch):
    """gate --budget hands the budget to compare's runs of two refs, and judges at the alpha they spent."""
    b, h, v = files(tmp_path, timing_run(), timing_run(), verify_run())
    seen: dict = {}

    def fake_compared_files(sides, choice, *, save_dir, budget, **kwargs):
        seen["budget_s"] = budget.seconds
        return SidePaths([Path(b), Path(h)], alpha=0.01)

    def fake_compare_runs(base, head, *, factor, alpha, **kwargs):
        seen["alpha"] = alpha
        return compare_runs(base, head, factor=factor, alpha=alpha)

    monkeypatch.setattr(gate_command, "compared_files", fake_compared_files)
    monkeypatch.setattr(gate_command, "compare_runs", fake_compare_runs)
    monkeypatch.chdir(REPO)
    gate_command.run(
        "HEAD", "HEAD", CaseChoice(["tiny"]), verify=[v], save_dir=str(tmp_path), console=QUIET, budget_s=60
    )
    assert seen == {"budget_s": 60, "alpha": 0.01}


def test_the_timing_table_prints_the_time_every_view_prints():
    """Issue 37: the table (and the report's Base vs head, which is this table) printed the pooled
    median over repeats beside a ratio of round estimates; its cells are format_time's, the estimate."""
    base = timing_run()

    # a pair where the pooled median over repeats and the round estimate (three rounds) differ
    def moved(c):
        m = 1.5 * c.estimate.median_s
        return dataclasses.replace(c, estimate=Estimate(median_s=m, low_s=0.9 * m, high_s=1.1 * m, rounds=3))

    base.cases = [moved(c) if c.estimate is not None else c for c in base.cases]
    result = outcome(base, timing_run(), verify_run())
    table = timing_table(result)
    assert table.rows
    for row, case in zip(table.rows, result.comparison.cases, strict=False):
        assert row[1] == format_time(case.base) and row[2] == format_time(case.head)
        assert f"{case.base.estimate.median_s * 1e3:.3f} ms" in row[1]
        assert f"{case.base.timing.median_s * 1e3:.3f} ms" not in row[1]
