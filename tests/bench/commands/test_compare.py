"""`bench compare`: verdicts on synthetic results with known outcomes, comparability, exit codes, markdown,
the round-by-round A/B runner, and one real comparison of two git refs in a temporary clone."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from gitrepo import git
from rich.console import Console
from tiny import TINY_LAYER, TINY_LAYER_YAML

from bench.cli import main
from bench.commands import common_args, compare
from bench.commands.session import CaseChoice
from bench.errors import UserError
from bench.formats import format_time
from bench.judge.comparison import (
    DEFAULT_FACTOR,
    comparability,
    compare_runs,
    look_rounds,
    not_comparable_note,
    override_flag,
)
from bench.launch import ref_rounds
from bench.launch.gitrefs import RefSide, resolve_side
from bench.launch.interleave import Checkout, Planned, Staged, bench_run_argv, run_alternating, run_on_side
from bench.measure.contention import Contention
from bench.measure.gate import CaseCheck, Fingerprints
from bench.measure.statistics import estimate
from bench.measure.timing import summarize
from bench.render import comparison as comparison_view
from bench.results.env import Environment
from bench.results.store import CaseResult, MemoryResult, RoundResult, RunResult, load_result, save_result
from bench.suite.config import Case, SuiteConfig

FIXTURES = Path(__file__).parents[1] / "fixtures"
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115
REPO = Path(__file__).resolve().parents[3]
IN_GIT = pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the project's git checkout")

SCENARIO = {
    "name": "synthetic",
    "description": "made up",
    "device": None,
    "hidden_size": 32,
    "num_k_heads": 2,
    "num_v_heads": 4,
    "head_k_dim": 8,
    "head_v_dim": 8,
    "conv_kernel_size": 4,
    "chunk_size": 8,
    "dtype": "fp32",
    "batch": 1,
    "seed": 0,
    "warmup": 1,
    "repeat": 10,
    "sweeps": [],
    "cp": [2],
    "seq_len": [64],
    "mode": ["ulysses", "p2p"],
    "checkpoint": [True],
    "pass": ["forward"],
}


def environment(**changes) -> Environment:
    env = Environment(
        git_commit="a" * 40,
        git_branch="main",
        git_date="2026-12-01T10:00:00+00:00",
        git_subject="a commit",
        git_dirty=False,
        python_version="3.11.7",
        torch_version="2.13.0+cpu",
        torch_npu_version=None,
        device_type="cpu",
        device_name="x86_64",
        backend="gloo",
        hostname="vm",
        cpu_model="Intel(R) Xeon(R) Processor",
        cpu_count=2,
        threads_per_rank=None,
        world_sizes=[2],
        launcher="local",
    )
    return dataclasses.replace(env, **changes)


def case(mode: str = "p2p", seq_len: int = 64, warmup: int = 1) -> Case:
    return Case(
        scenario="synthetic",
        mode=mode,
        checkpoint=None if mode == "ulysses" else True,
        cp=2,
        seq_len=seq_len,
        pass_="forward",
        layer=TINY_LAYER,
        batch=1,
        seed=0,
        warmup=warmup,
        repeat=10,
    )


def ok(
    c: Case,
    median_ms: float,
    *,
    spread: float = 0.01,
    seed: int = 0,
    repeats: int = 10,
    rounds: int = 3,
    mib: float = 10.0,
):
    """An ok result of `rounds` rounds whose medians scatter by `spread` (relative) around `median_ms` (a
    process lifetime's luck), each round's repeats by a tenth of that around its median."""
    rng = np.random.default_rng(seed)
    measured = []
    for _ in range(rounds):
        centre = median_ms / 1e3 * (1 + spread * rng.standard_normal())
        rank0 = (centre * (1 + spread / 10 * rng.standard_normal(repeats))).tolist()
        measured.append(RoundResult(samples_s=[rank0, [x * 0.9 for x in rank0]]))  # rank-max is rank 0
    pooled = [[s for r in measured for s in r.samples_s[rank]] for rank in range(2)]
    peak = int(mib * 2**20)
    return CaseResult(
        case=c,
        status="ok",
        rounds=measured,
        estimate=estimate([r.median_s for r in measured]),
        timing=summarize(pooled),
        memory=MemoryResult(
            peak_bytes=peak, per_rank_bytes=[peak, peak], baseline_bytes=[0, 0], meter="test"
        ),
        threads_per_rank=1,
    )


def run_of(*results: CaseResult, env: Environment | None = None, **scenario_changes) -> RunResult:
    return RunResult(
        name="synthetic",
        environment=env or environment(),
        suite=SuiteConfig(),
        scenarios={"synthetic": {**SCENARIO, **scenario_changes}},
        cases=list(results),
    )


def test_verdicts_from_known_outcomes():
    base = run_of(
        ok(case("ulysses", 64), 100, seed=1),
        ok(case("p2p", 64), 100, seed=2),
        ok(case("ulysses", 128), 100, seed=3),
        ok(case("p2p", 128), 100, spread=0.002, seed=7),
    )
    head = run_of(
        ok(case("ulysses", 64), 70, seed=4),  # clearly faster
        ok(case("p2p", 64), 140, seed=5, mib=12.0),  # clearly slower, more memory
        ok(case("ulysses", 128), 100, spread=0.05, seed=6),  # the same, noisy between rounds
        ok(case("p2p", 128), 102, spread=0.002, seed=8),  # 2% slower, measured precisely: below the factor
        env=environment(git_commit="b" * 40),  # another commit is what is compared, not a mismatch
    )
    result = compare_runs(base, head)
    verdicts = {c.key.split("/")[1]: c for c in result.cases}
    faster, slower, noise, small = (
        verdicts[k]
        for k in (
            "ulysses-cp2-T64-fwd",
            "p2p-ckpt-cp2-T64-fwd",
            "ulysses-cp2-T128-fwd",
            "p2p-ckpt-cp2-T128-fwd",
        )
    )
    assert faster.verdict == "better" and faster.ratio == pytest.approx(0.7, rel=0.03)
    assert faster.high <= 1 / 1.1 and faster.low < faster.ratio < faster.high and faster.p_value < 0.001
    assert slower.verdict == "worse" and slower.ratio == pytest.approx(1.4, rel=0.03) and slower.low >= 1.1
    assert slower.memory_delta_mib == pytest.approx(2.0) and slower.memory_delta_pct == pytest.approx(20.0)
    assert noise.verdict == "too noisy" and noise.high / noise.low > 1.1 and noise.detectable > 1.1
    assert small.verdict == "~" and small.low < 1.1 and small.high / small.low <= 1.1
    assert faster.rounds == (3, 3) and faster.contended_rounds == (0, 0)
    assert result.summary() == "1 better, 1 worse, 1 ~, 0 not comparable, 1 too noisy"
    assert not result.interleaved  # two runs of their own: drift between them is not controlled


def test_one_round_is_no_verdict_however_large_the_ratio():
    """One round per side (e.g. a schema 1 file) shows no variance between process lifetimes."""
    base = run_of(ok(case(), 100, rounds=1))
    head = run_of(ok(case(), 200, rounds=1, seed=1))
    (c,) = compare_runs(base, head).cases
    assert c.ratio == pytest.approx(2.0, rel=0.05)
    assert c.verdict == "too noisy" and c.low is None and c.detectable is None and c.p_value is None


def test_contended_rounds_are_left_out_per_round():
    shared = Contention(foreign=0.5, steal=0.0, load_before=2.0, load_after=2.0)
    quiet = Contention(foreign=0.01, steal=0.0, load_before=0.1, load_after=0.1)
    head = ok(case(), 200, rounds=4, seed=1)
    for r, c in zip(head.rounds, (shared, quiet, quiet, quiet), strict=True):
        r.contention = c
    (c,) = compare_runs(run_of(ok(case(), 100)), run_of(head)).cases
    assert c.verdict == "worse" and c.rounds == (3, 3) and c.contended_rounds == (0, 1)
    for r in head.rounds[1:3]:
        r.contention = shared  # one clean round left: no interval on that side
    (c,) = compare_runs(run_of(ok(case(), 100)), run_of(head)).cases
    assert c.verdict == "contended" and c.contended_rounds == (0, 3)


def test_rounds_of_one_session_are_interleaved():
    base, head = run_of(ok(case(), 100)), run_of(ok(case(), 100, seed=1))
    base.session = head.session = "s1"
    assert compare_runs(base, head).interleaved
    head.session = "s2"
    assert not compare_runs(base, head).interleaved


def with_lifetimes(result: CaseResult, ids: list[str | None]) -> CaseResult:
    """`result` with its rounds' lifetimes set to `ids`."""
    rounds = [dataclasses.replace(r, lifetime=i) for r, i in zip(result.rounds, ids, strict=True)]
    return dataclasses.replace(result, rounds=rounds)


def test_rounds_measured_in_shared_lifetimes_compare_paired():
    """Lifetimes 20% apart that both sides share: Welch's interval carries that spread, the paired one
    cancels it and calls the 25% slower head."""
    lives = np.array([1.0, 1.2, 0.85, 1.1, 0.95])
    base, head = ok(case(), 100, rounds=5), ok(case(), 125, rounds=5)
    for result, centre in ((base, 0.100), (head, 0.125)):
        for r, life in zip(result.rounds, lives * centre * (1 + 0.01 * np.arange(5)), strict=True):
            r.samples_s = [[float(life)] * 3, [float(life) * 0.9] * 3]
    ids = [f"pool-{i}" for i in range(5)]
    (paired,) = compare_runs(run_of(with_lifetimes(base, ids)), run_of(with_lifetimes(head, ids))).cases
    (welch,) = compare_runs(run_of(base), run_of(head)).cases
    assert paired.paired and paired.verdict == "worse" and paired.low > 1.2
    assert not welch.paired and welch.verdict == "too noisy" and welch.detectable > 1.25  # blind to it
    # a lifetime only one side has, or a side without lifetimes (an older file): not paired
    other = [*ids[:4], "pool-x"]
    (mixed,) = compare_runs(run_of(with_lifetimes(base, ids)), run_of(with_lifetimes(head, other))).cases
    (older,) = compare_runs(run_of(with_lifetimes(base, ids)), run_of(head)).cases
    assert not mixed.paired and not older.paired


def test_a_contended_paired_round_leaves_out_both_sides():
    ids = [f"pool-{i}" for i in range(4)]
    base, head = (with_lifetimes(ok(case(), ms, rounds=4, seed=s), ids) for ms, s in ((100, 1), (101, 2)))
    shared = Contention(foreign=0.6, steal=0.0, load_before=2.0, load_after=2.0)
    for result in (base, head):
        result.rounds[1] = dataclasses.replace(result.rounds[1], contention=shared)
    (c,) = compare_runs(run_of(base), run_of(head)).cases
    assert c.paired and c.rounds == (3, 3) and c.contended_rounds == (1, 1)


def test_a_small_significant_change_is_not_a_verdict():
    (c,) = compare_runs(run_of(ok(case(), 100, spread=0.001)), run_of(ok(case(), 103, spread=0.001))).cases
    assert c.p_value < 0.001 and c.verdict == "~"  # 3% < the 5% factor: the interval lies within it
    (c,) = compare_runs(
        run_of(ok(case(), 100, spread=0.001)), run_of(ok(case(), 103, spread=0.001)), factor=1.02
    ).cases
    assert c.verdict == "worse"


def test_an_interval_across_the_factor_is_undecided():
    """5% slower, measured tightly, against a 5% factor: the interval straddles it, so neither worse nor ~."""
    (c,) = compare_runs(run_of(ok(case(), 100, spread=0.001)), run_of(ok(case(), 105, spread=0.001))).cases
    assert c.low < DEFAULT_FACTOR < c.high and c.verdict == "too noisy"


def test_mismatched_environments_are_not_comparable_unless_forced():
    base = run_of(ok(case(), 100))
    head = run_of(ok(case(), 200, seed=1), env=environment(cpu_count=8, torch_version="2.14.0"))
    (c,) = compare_runs(base, head).cases
    assert c.verdict == "not comparable"
    assert "different machine (cpu_count 2 vs 8)" in c.not_comparable
    assert "different software (torch_version '2.13.0+cpu' vs '2.14.0')" in c.not_comparable
    (forced,) = compare_runs(base, head, force=True).cases
    assert forced.verdict == "worse" and forced.forced


def test_a_machine_is_its_hardware_not_its_hostname():
    """Issue 46: one rule for compare and history, whose machine is the CPU model, cores and device (a CI
    runner's hostname changes every run): another hostname alone is comparable."""
    base = run_of(ok(case(), 100))
    renamed = run_of(ok(case(), 200, seed=1), env=environment(hostname="ci-3"))
    assert comparability(base, base.cases[0], renamed, renamed.cases[0]) is None
    (c,) = compare_runs(base, renamed).cases
    assert c.verdict == "worse"


def test_two_sides_that_compute_different_outputs_are_not_comparable():
    """Issue 44: where both sides' correctness gate fingerprinted a case (bench.measure.gate), a head that
    computes other outputs (a wrong kernel) is never called better; --allow-different-outputs lifts exactly
    that check, and rounding under the bar stays comparable."""
    rng = np.random.default_rng(0)
    base_print = rng.standard_normal(32).tolist()

    def checked(result: CaseResult, change: float) -> CaseResult:
        prints = Fingerprints(o=[v * (1 + change) for v in base_print])
        return dataclasses.replace(result, check=CaseCheck(bar=1e-3, fingerprints=prints))

    base = run_of(checked(ok(case("p2p"), 100, seed=1), 0.0), checked(ok(case("ulysses"), 100, seed=2), 0.0))
    head = run_of(checked(ok(case("p2p"), 50, seed=3), 0.3), checked(ok(case("ulysses"), 50, seed=4), 1e-5))
    comparison = compare_runs(base, head)
    wrong, rounded = (next(c for c in comparison.cases if c.base.case.mode == m) for m in ("p2p", "ulysses"))
    assert wrong.verdict == "not comparable"
    assert wrong.not_comparable.startswith(
        "the refs compute different outputs (rel-L2 3.0e-01 on o, bar 1e-03"
    )
    assert override_flag(wrong.not_comparable) == "--allow-different-outputs"
    assert not_comparable_note(wrong.not_comparable, 1).endswith(
        "; --allow-different-outputs compares them anyway"
    )
    assert override_flag(wrong.not_comparable + "; different machine (cpu_count 2 vs 8)") == "--force"
    assert rounded.verdict == "better"
    allowed = compare_runs(base, head, allow_different_outputs=True)
    assert all(c.verdict == "better" for c in allowed.cases)


def test_scenario_definitions_compare_on_the_keys_that_change_numbers():
    base = run_of(ok(case(), 100))
    same = run_of(ok(case(), 100), description="reworded", repeat=5, **{"seq_len": [64, 128]})
    assert comparability(base, base.cases[0], same, same.cases[0]) is None
    wider = run_of(ok(case(), 100), hidden_size=64)
    assert "different scenario synthetic (hidden_size 32 vs 64)" in comparability(
        base, base.cases[0], wider, wider.cases[0]
    )
    warmer = run_of(ok(case(warmup=5), 100))  # effective warmup, from the case
    assert "warmup 1 vs 5" in comparability(base, base.cases[0], warmer, warmer.cases[0])
    other_device = run_of(
        ok(case(), 100), env=environment(device_type="cuda", device_name="H100", backend="nccl")
    )
    reason = comparability(base, base.cases[0], other_device, other_device.cases[0])
    assert reason.startswith("different device (device_type 'cpu' vs 'cuda'")


def test_missing_and_failed_cases_are_listed_not_compared():
    failed = CaseResult(
        case=case("ulysses"), status="failed", error="MemoryError: out of memory on rank 1\ntrace"
    )
    base = run_of(ok(case("p2p"), 100), ok(case("ulysses"), 100), ok(case("p2p", 128), 100))
    head = run_of(ok(case("p2p"), 100, seed=1), failed, ok(case("p2p", 256), 100))
    result = compare_runs(base, head)
    assert [c.key for c in result.cases] == ["synthetic/p2p-ckpt-cp2-T64-fwd"]
    reasons = {n.key.split("/")[1]: (n.base_status, n.head_status, n.reason) for n in result.not_compared}
    assert reasons == {
        "ulysses-cp2-T64-fwd": ("ok", "failed", "head: MemoryError: out of memory on rank 1"),
        "p2p-ckpt-cp2-T128-fwd": ("ok", "missing", "only on base"),
        "p2p-ckpt-cp2-T256-fwd": ("missing", "ok", "only on head"),
    }
    assert [n.key for n in result.head_failures] == ["synthetic/ulysses-cp2-T64-fwd"]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Result files: base, a slower head, a faster head, a head whose only change is a failure."""
    out = {
        "base": run_of(ok(case("ulysses"), 100), ok(case("p2p"), 100, seed=1)),
        "slower": run_of(ok(case("ulysses"), 100, seed=2), ok(case("p2p"), 150, seed=3)),
        "faster": run_of(ok(case("ulysses"), 100, seed=2), ok(case("p2p"), 60, seed=3)),
        "broken": run_of(
            ok(case("ulysses"), 100, seed=2), CaseResult(case=case("p2p"), status="failed", error="boom")
        ),
    }
    paths = {}
    for name, run in out.items():
        paths[name] = tmp_path / f"{name}.json"
        save_result(run, paths[name])
    return paths


def test_fail_on_regression_exit_codes(files):
    args = ["compare", str(files["base"])]
    assert main([*args, str(files["slower"])]) == 0  # without the flag a regression is only reported
    assert main([*args, str(files["slower"]), "--fail-on-regression"]) == common_args.EXIT_REGRESSION == 3
    assert main([*args, str(files["faster"]), "--fail-on-regression"]) == 0
    assert main([*args, str(files["broken"]), "--fail-on-regression"]) == 3  # ok on base, failed on head
    assert main([*args, str(files["slower"]), "--fail-on-regression", "--filter", "mode=ulysses"]) == 0


def test_fail_on_regression_fails_when_nothing_was_compared(files, tmp_path, capsys):
    save_result(run_of(), tmp_path / "empty.json")  # e.g. a head run that was interrupted at once
    other = run_of(ok(case("ulysses"), 100), ok(case("p2p"), 100), env=environment(cpu_count=8))
    save_result(other, tmp_path / "other-host.json")
    base = ["compare", str(files["base"])]
    for head, why in [
        ("empty.json", f"head ({tmp_path / 'empty.json'}) has no cases"),
        ("other-host.json", "no case is comparable (see the notes above; --force compares them anyway)"),
    ]:
        assert main([*base, str(tmp_path / head)]) == 0  # without the flag: only reported
        assert main([*base, str(tmp_path / head), "--fail-on-regression"]) == 1
        err = capsys.readouterr().err
        assert f"error: --fail-on-regression: nothing was compared ({why}), so the gate cannot pass" in err
    assert main([*base, str(files["faster"]), "--fail-on-regression", "--filter", "cp=4"]) == 1
    assert "has no cases after --filter), so the gate cannot pass" in capsys.readouterr().err


def test_fail_on_regression_fails_when_no_case_got_a_verdict(files, tmp_path, capsys):
    """Every round contended (a busy CI host): no verdict anywhere, so the gate fails (exit 6, as bench gate)
    instead of passing a change it never judged."""
    busy = Contention(foreign=0.5, steal=0.0, load_before=2.0, load_after=2.0)
    cases = [ok(case("ulysses"), 100), ok(case("p2p"), 100, seed=1)]
    for result in cases:
        for r in result.rounds:
            r.contention = busy
    save_result(run_of(*cases), tmp_path / "contended.json")
    args = ["compare", str(files["base"]), str(tmp_path / "contended.json")]
    assert main(args) == 0  # without the flag: only reported
    capsys.readouterr()
    assert main([*args, "--fail-on-regression"]) == common_args.EXIT_NO_VERDICT == 6
    err = capsys.readouterr().err
    assert "no case got a verdict (0 too noisy, 2 contended, 0 not comparable)" in err


def test_user_errors_are_one_line_exit_1(files, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git checkout
    assert main(["compare", str(files["base"]), "no-such-ref"]) == 1
    err = capsys.readouterr().err
    assert "no-such-ref: no such result file, and not a git ref either" in err
    assert main(["compare", str(files["base"]), str(files["slower"]), "--set", "repeat=3"]) == 1
    assert "two result files run nothing" in capsys.readouterr().err
    assert main(["compare", str(files["base"]), str(files["slower"]), "--factor", "0.9"]) == 1


def test_table_and_markdown_output(files):
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    assert compare.run(str(files["base"]), str(files["slower"]), console=console) == 0
    text = console.export_text()
    for column in comparison_view.COLUMNS:
        assert column in text
    assert "p2p-ckpt-cp2-T64-fwd" in text and "worse" in text
    assert "0 better, 1 worse, 1 ~, 0 not comparable" in text

    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    assert compare.run(str(files["base"]), str(files["slower"]), fmt="markdown", console=console) == 0
    md = console.export_text()
    assert "| case | verdict | head/base | base | head | detects | mem delta |" in md
    assert "| :--- | :--- | ---: | ---: | ---: | ---: | ---: |" in md
    slower = load_result(files["slower"]).cases[1]
    row = next(line for line in md.splitlines() if line.startswith("| p2p-ckpt-cp2-T64-fwd"))
    assert f"| {format_time(slower)} |" in row and "| worse |" in row  # the time every view prints
    assert "drift between the two runs is not controlled" in md
    assert "**0 better, 1 worse, 1 \\~, 0 not comparable**" in md
    assert "base `base.json (main@aaaaaaaa)` vs head `slower.json (main@aaaaaaaa)`" in md


def test_json_output_for_ci_bots(files):
    """Verdicts, ratios with intervals, the change each case could detect and both sides' estimates."""
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    assert compare.run(str(files["base"]), str(files["slower"]), fmt="json", console=console) == 0
    data = json.loads(console.export_text())
    assert data["counts"]["worse"] == 1 and data["counts"]["~"] == 1 and data["factor"] == DEFAULT_FACTOR
    worse = next(c for c in data["cases"] if c["verdict"] == "worse")
    slower = load_result(files["slower"]).get(worse["key"])
    assert worse["judged"] and worse["low"] <= worse["ratio"] <= worse["high"] and worse["low"] >= 1.10
    assert worse["detectable"] > 1 and worse["head"]["estimate_s"] == slower.estimate.median_s
    assert worse["head"]["rounds"] == len(slower.rounds) and worse["base"]["contended_rounds"] == 0
    with pytest.raises(UserError, match="--format yaml: unknown format; use one of table, markdown, json"):
        compare.run(str(files["base"]), str(files["slower"]), fmt="yaml", console=console)


# ----------------------------------------------------------------------------------------------------------
# Refs: the A/B runner


def test_run_alternates_base_and_head_round_by_round(tmp_path):
    side = RefSide(spec="main", commit="c" * 40)
    checkouts = [
        Checkout(name=n, side=side, root=tmp_path, output=tmp_path / f"{n}.json") for n in ("base", "head")
    ]
    plan = [
        Planned(scenario_file=tmp_path / "s.yaml", case=dataclasses.replace(case(seq_len=n), rounds=r))
        for n, r in ((64, 2), (128, 3))
    ]
    calls = []

    def fake(checkout, staged, *, resume, stop_after, sets, device):
        calls.append((checkout.name, stop_after, resume))
        return run_of()

    staged = Staged(config=tmp_path / "bench.yaml", plan=plan)
    run_alternating(checkouts, staged, runner=fake)
    assert staged.rounds == 3
    assert calls == [
        ("base", 1, False),
        ("head", 1, False),
        ("base", 2, True),
        ("head", 2, True),
        ("base", 3, True),
        ("head", 3, True),
    ]


def test_bench_run_argv_writes_then_resumes_one_round_at_a_time(tmp_path):
    plan = [Planned(scenario_file=tmp_path / "s.yaml", case=case(mode)) for mode in ("p2p", "ulysses")]
    staged = Staged(config=tmp_path / "b.yaml", plan=plan)
    first = bench_run_argv(staged, tmp_path / "o.json", resume=False, stop_after=1, sets=["repeat=5"])
    assert first[:4] == [sys.executable, "-m", "bench", "run"]
    assert first[4:] == [
        str(tmp_path / "s.yaml"),
        "--config",
        str(tmp_path / "b.yaml"),
        "--filter",
        "scenario=synthetic,case_id=p2p-ckpt-cp2-T64-fwd",
        "--filter",
        "scenario=synthetic,case_id=ulysses-cp2-T64-fwd",
        "--output",
        str(tmp_path / "o.json"),
        "--stop-after-round",
        "1",
        "--set",
        "repeat=5",
    ]
    again = bench_run_argv(staged, tmp_path / "o.json", resume=True, stop_after=2, device="cpu")
    assert "--resume" in again and "--output" not in again and again[-2:] == ["--device", "cpu"]
    assert again[again.index("--stop-after-round") + 1] == "2"


FAKE_BENCH = """\
import shutil, sys
argv = sys.argv[1:]
{body}
"""


def fake_checkout(tmp_path: Path, body: str, commit: str = "c" * 40) -> Checkout:
    """A 'worktree' whose bench package is a stand-in: if it runs, the side's own code ran."""
    root = tmp_path / "wt"
    (root / "bench").mkdir(parents=True)
    (root / "bench" / "__init__.py").write_text("")
    (root / "bench" / "__main__.py").write_text(FAKE_BENCH.format(body=textwrap.dedent(body)))
    return Checkout(
        name="base", side=RefSide(spec="v0.1", commit=commit), root=root, output=tmp_path / "o.json"
    )


def test_a_ref_whose_bench_cannot_run_the_scenario_is_a_clear_error(tmp_path):
    checkout = fake_checkout(
        tmp_path, 'print("error: s.yaml:3: local_seq_len: unknown key", file=sys.stderr); sys.exit(1)'
    )
    staged = Staged(
        config=tmp_path / "b.yaml", plan=[Planned(scenario_file=tmp_path / "s.yaml", case=case())]
    )
    with pytest.raises(
        UserError,
        match=r"base v0\.1 \(cccccccc\): its bench cannot run round 1 of the staged cases "
        r"\(exit 1: s.yaml:3: local_seq_len: unknown key\); the ref may predate",
    ):
        run_on_side(checkout, staged, resume=False, stop_after=1)


def test_the_sides_own_code_runs_and_its_commit_is_checked(tmp_path):
    # The stand-in bench copies a real result file to --output: it ran (not the installed bench), but the
    # file records another commit than the side's, which the runner refuses.
    body = f"shutil.copyfile({str(FIXTURES / 'ablation.json')!r}, argv[argv.index('--output') + 1])"
    checkout = fake_checkout(tmp_path, body)
    staged = Staged(
        config=tmp_path / "b.yaml", plan=[Planned(scenario_file=tmp_path / "s.yaml", case=case())]
    )
    with pytest.raises(
        UserError, match="the run recorded commit ebe7b0e1, not cccccccc: another copy of bench ran"
    ):
        run_on_side(checkout, staged, resume=False, stop_after=1)
    assert (tmp_path / "o.json").is_file()


@IN_GIT
def test_resolve_side(tmp_path, files):
    assert resolve_side(str(files["base"]), tmp_path).path == files["base"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    side = resolve_side("HEAD", REPO)
    assert isinstance(side, RefSide) and side.commit == head
    with pytest.raises(UserError, match="not a commit of"):
        resolve_side("no-such-branch-xyz", REPO)


# ----------------------------------------------------------------------------------------------------------
# A real comparison of two refs


TINY = f"""\
description: one tiny case for the compare test
device: cpu
{TINY_LAYER_YAML}warmup: 0
repeat: 2
rounds: 2
cp: [1]
seq_len: [64]
mode: [ulysses]
pass: [forward]
"""
MARKER = "compare-test marker: head's store.py"


@IN_GIT
@pytest.mark.multirank
def test_compare_two_refs_runs_each_refs_own_code(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    git(tmp_path, "clone", "--quiet", str(REPO), str(repo))
    store = repo / "bench" / "results" / "store.py"
    text = store.read_text()
    assert "MEMORY_INCLUDES = (\n" in text
    store.write_text(text.replace("MEMORY_INCLUDES = (\n", f'MEMORY_INCLUDES = (\n    "{MARKER}; "\n', 1))
    git(repo, "commit", "--quiet", "-am", "marker in the memory description")
    base_commit, head_commit = git(repo, "rev-parse", "HEAD~1"), git(repo, "rev-parse", "HEAD")
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    monkeypatch.chdir(repo)

    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    code = compare.run(
        "HEAD~1",
        "HEAD",
        CaseChoice([str(scenario)], ["rounds=2"]),
        save_dir=str(tmp_path / "out"),
        console=console,
        paired=False,
    )
    text = console.export_text()
    assert code == 0, text
    (base_file,) = (tmp_path / "out").glob("base-*.json")
    (head_file,) = (tmp_path / "out").glob("head-*.json")
    base, head = load_result(base_file), load_result(head_file)
    assert base.environment.git_commit == base_commit and head.environment.git_commit == head_commit
    assert not base.environment.git_dirty and not head.environment.git_dirty
    (b,), (h,) = base.cases, head.cases
    assert b.key == h.key == "tiny/ulysses-cp1-T64-fwd" and b.status == h.status == "ok"
    assert MARKER in h.memory.includes and MARKER not in b.memory.includes  # each ref's own store.py ran
    assert len(b.rounds) == len(h.rounds) == 2 and base.session == head.session is not None
    assert "ulysses-cp1-T64-fwd" in text and "0 better, 0 worse, " in text
    assert "drift between the two runs is not controlled" not in text
    assert git(repo, "worktree", "list").count("\n") == 0  # the temporary worktrees are gone


# ----------------------------------------------------------------------------------------------------------
# Unpaired refs: the orchestration (worktrees, staging, saving, Ctrl-C), a stand-in for each side's round


@pytest.fixture
def repo(suite_dir: Path) -> Path:
    """The throwaway suite (bench.yaml + scenarios/tiny.yaml: 2 cases) as a git repository, one commit."""
    git(suite_dir, "init", "--quiet", "-b", "main")
    git(suite_dir, "add", ".")
    git(suite_dir, "commit", "--quiet", "-m", "suite")
    return suite_dir


def stand_in(
    calls: list,
    *,
    slower_head: bool = True,
    interrupt_at: int | None = None,
    head_factor: float = 2.0,
    spread: float = 0.01,
):
    """A runner that records its calls and writes a result file as `bench run --stop-after-round` would
    (the side's commit, the session, one more round of every planned case): head `head_factor` times
    base's 100 ms when `slower_head`, round medians scattered by `spread`."""

    def runner(checkout, staged, *, resume, stop_after, sets, device):
        calls.append((checkout.name, stop_after, resume, checkout.root.is_dir()))
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        if resume:
            run = load_result(checkout.output)
        else:
            scenario_file = staged.plan[0].scenario_file
            run = RunResult(
                name="tiny",
                environment=environment(git_commit=checkout.side.commit),
                suite=SuiteConfig(),
                scenarios={"tiny": yaml.safe_load(scenario_file.read_text()) | {"name": "tiny"}},
                session=staged.session,
            )
        slow = slower_head and checkout.name == "head"
        for planned in staged.plan:
            seed = len(calls) * 100 + len(run.cases)
            fresh = ok(planned.case, 100 * (head_factor if slow else 1), seed=seed, rounds=1, spread=spread)
            before = run.get(planned.case.key())
            rounds = (before.rounds if before is not None else []) + fresh.rounds
            run.cases = [c for c in run.cases if c.key != planned.case.key()]
            run.cases.append(
                dataclasses.replace(fresh, rounds=rounds, estimate=estimate([r.median_s for r in rounds]))
            )
        save_result(run, checkout.output)
        return run

    return runner


def test_refs_run_alternating_in_worktrees_and_are_saved(repo, tmp_path):
    calls: list = []
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    code = compare.run(
        "HEAD",
        "main",
        save_dir=str(tmp_path / "saved"),
        console=console,
        runner=stand_in(calls),
        fail_on_regression=True,
        paired=False,
    )
    text = console.export_text()
    assert code == 3, text  # head is twice as slow
    assert [(n, k, r) for n, k, r, _ in calls] == [  # the suite's 2 rounds, base and head in turn
        ("base", 1, False),
        ("head", 1, False),
        ("base", 2, True),
        ("head", 2, True),
    ]
    assert all(existed for *_, existed in calls)  # each ran inside its worktree
    commit = git(repo, "rev-parse", "HEAD")[:8]
    (base_file,) = (tmp_path / "saved").glob("base-*.json")
    (head_file,) = (tmp_path / "saved").glob("head-*.json")
    assert base_file.name.endswith(f"-HEAD-{commit}-tiny.json") and head_file.name.endswith(
        f"-main-{commit}-tiny.json"
    )
    base_run, head_run = load_result(base_file), load_result(head_file)
    assert len(head_run.cases) == 4 and all(len(c.rounds) == 2 for c in head_run.cases)
    assert base_run.session == head_run.session is not None  # one session: drift shared
    assert "0 better, 4 worse, 0 ~, 0 not comparable" in text and "compare them again" in text
    assert "drift between the two runs is not controlled" not in text
    assert git(repo, "worktree", "list").count("\n") == 0


def test_two_refs_get_the_suites_compare_rounds_unless_rounds_are_set(repo, tmp_path):
    """A verdict needs more rounds than a run's estimate: two refs get compare_rounds (3 here) where the
    scenario plans fewer (2); `--set rounds` is the user's word and stands."""
    (repo / "bench.yaml").write_text(
        (repo / "bench.yaml").read_text().replace("compare_rounds: 2", "compare_rounds: 3")
    )
    for sets, rounds in (((), 3), (("rounds=2",), 2)):
        calls: list = []
        save = tmp_path / f"saved-{rounds}"
        compare.run(
            "HEAD",
            "main",
            CaseChoice(sets=sets),
            save_dir=str(save),
            console=QUIET,
            runner=stand_in(calls),
            paired=False,
        )
        assert [k for _, k, *_ in calls] == [k for k in range(1, rounds + 1) for _side in (0, 1)]
        (head_file,) = save.glob("head-*.json")
        assert all(c.case.rounds == rounds for c in load_result(head_file).cases)


def compare_with_budget(tmp_path: Path, head: str, runner) -> tuple[int, dict]:
    """`bench compare HEAD <head> --budget 600 --format json --unpaired` through the stand-in `runner`: the
    exit code and the JSON."""
    console = Console(width=200, record=True, file=io.StringIO())
    code = compare.run(
        "HEAD",
        head,
        save_dir=str(tmp_path / "s"),
        runner=runner,
        console=console,
        fmt="json",
        budget_s=600,
        paired=False,
    )
    return code, json.loads(console.export_text())


def test_a_budget_adds_rounds_to_undecided_cases_until_they_are_called(repo, tmp_path):
    """Head 1.25x slower, round medians scattered by 12%: two rounds a side decide nothing; --budget adds
    rounds, look by look (bench.judge.comparison.look_rounds), to the undecided cases only, until each is
    called worse, every look at alpha / looks."""
    calls: list = []
    code, data = compare_with_budget(tmp_path, "main", stand_in(calls, head_factor=1.25, spread=0.12))
    assert code == 0 and {c["verdict"] for c in data["cases"]} == {"worse"}, data["summary"]
    looks = look_rounds(2, ref_rounds.ADAPTIVE_MAX_ROUNDS)  # the tiny suite plans 2 rounds
    assert data["alpha"] == pytest.approx(0.05 / len(looks))
    rounds = {c["key"]: c["rounds"][0] for c in data["cases"]}
    assert all(r in looks and r > 2 for r in rounds.values()), rounds  # judged at a look, after more rounds
    extra = [(name, k) for name, k, _, _ in calls if k > 2]
    assert extra and all(k <= max(rounds.values()) for _, k in extra)  # no round past the last decision


def test_a_budget_never_calls_an_unchanged_head(repo, tmp_path):
    """A/A with 12% scatter: every look at alpha / looks, up to the most rounds; no case better or worse."""
    calls: list = []
    code, data = compare_with_budget(tmp_path, "HEAD", stand_in(calls, slower_head=False, spread=0.12))
    assert code == 0
    assert data["counts"]["worse"] == data["counts"]["better"] == 0, data["summary"]
    # undecided cases ran every look to the most rounds; a case called ~ stopped at its look
    assert all(c["rounds"][0] == ref_rounds.ADAPTIVE_MAX_ROUNDS or c["verdict"] == "~" for c in data["cases"])


def test_rounds_a_budget_adds_time_enough_passes_of_short_cases():
    """An added round times ADDED_ROUND_TIMED_S of each side's passes, an even count, never fewer than the
    case's repeat: 14 ms passes (head the faster side) get 22, 300 ms ones keep 10; cases not asked for and
    cases without an estimate get none."""
    short, long, other = case("p2p"), case("scan"), case("ulysses")
    comparison = compare_runs(
        run_of(ok(short, 15), ok(long, 300), ok(other, 14)),
        run_of(ok(short, 14), ok(long, 330), ok(other, 14)),
    )
    repeats = ref_rounds.added_repeats(comparison, [short.key(), long.key()], ref_rounds.ADDED_ROUND_TIMED_S)
    assert ref_rounds.ADDED_ROUND_TIMED_S == 0.3 and repeats == {short.key(): 22, long.key(): 10}


def test_a_budget_spends_its_rounds_on_the_cases_it_can_decide():
    """Of three undecided cases, one reads 1.05 (on the factor: never decided), one 1.2 (a few rounds from
    worse) and one 1.1 with a wide spread: with little budget left only the promising case gets rounds; the
    one on the boundary never while another fits."""
    near, boundary, wide = case("p2p"), case("scan"), case("ulysses")
    base = run_of(
        ok(near, 100, spread=0.05, seed=1), ok(boundary, 100, rounds=4), ok(wide, 100, spread=0.3, seed=3)
    )
    head = run_of(
        ok(near, 120, spread=0.05, seed=4), ok(boundary, 105, rounds=4), ok(wide, 110, spread=0.3, seed=6)
    )
    for i, (b, h) in enumerate(zip(base.cases[1].rounds, head.cases[1].rounds, strict=True)):
        b.samples_s = [[0.100] * 10] * 2
        h.samples_s = [[0.105 * 1.05 ** (-1) ** i] * 10] * 2  # 1.05 x (1.05, 1 / 1.05, ...): on the factor
    for run in (base, head):
        for c in run.cases:
            for r in c.rounds:
                r.wall_s = 1.0
    comparison = compare_runs(base, head, alpha=0.01)
    keys = [near.key(), boundary.key(), wide.key()]
    assert {c.key: c.verdict for c in comparison.cases} == dict.fromkeys(keys, "too noisy")

    def chosen(remaining_s: float) -> list[str]:
        return ref_rounds.promising(
            comparison, keys, done=3, next_look=5, remaining_s=remaining_s, repeats={}, alpha=0.01
        )

    assert chosen(1.0) == [near.key()]  # the first case always: the budget's deadline stops rounds
    assert chosen(1e6) == [near.key(), wide.key()]
    assert chosen(math.inf)[-1] == boundary.key()  # last, and only when the budget has no end


def test_a_budget_needs_two_refs(files):
    with pytest.raises(UserError, match="--budget"):
        compare.run(str(files["base"]), str(files["slower"]), budget_s=60, console=QUIET)


def test_a_ref_against_a_file_runs_only_the_files_cases(repo, tmp_path):
    base = tmp_path / "base.json"
    calls: list = []
    first_dir = str(tmp_path / "first")
    compare.run("HEAD", "HEAD", save_dir=first_dir, runner=stand_in(calls), console=QUIET, paired=False)
    (first,) = (tmp_path / "first").glob("base-*.json")
    run = load_result(first)
    run.cases = run.cases[:1]
    save_result(run, base)
    calls.clear()
    assert (
        compare.run(
            str(base), "HEAD", save_dir=str(tmp_path / "second"), runner=stand_in(calls), console=QUIET
        )
        == 0
    )
    assert [(n, k) for n, k, *_ in calls] == [("head", 1), ("head", 2)]  # only the ref runs
    (second,) = (tmp_path / "second").glob("head-*.json")
    assert [c.case.case_id for c in load_result(second).cases] == ["ulysses-cp1-T64-fwd_bwd"]  # file's cases


def test_ctrl_c_removes_the_worktrees_and_keeps_what_finished(repo, tmp_path):
    calls: list = []
    code = compare.run(
        "HEAD",
        "HEAD",
        save_dir=str(tmp_path / "saved"),
        runner=stand_in(calls, interrupt_at=3),
        console=QUIET,
        paired=False,
    )
    assert code == 130 and len(calls) == 3
    assert git(repo, "worktree", "list").count("\n") == 0
    assert len(list((tmp_path / "saved").glob("*.json"))) == 2  # round 1 of both sides
