"""`bench hist` (issue 46: pyperf's `hist`, pytest-benchmark's histogram): a case's passes by rank, repeat
and round as text, so that a bimodal machine is seen, not averaged into one estimate."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from rich.console import Console

from bench.cli import main
from bench.commands import hist as hist_command
from bench.errors import UserError
from bench.measure.contention import Contention
from bench.render.hist import case_histogram, histogram
from bench.results.store import RoundResult, load_result, save_result

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _bimodal():
    """A cp 2 case of four rounds: three lifetimes near 10 ms, one (contended) near 20 ms, where rank 1 is
    the slow one; its estimate alone would read as one noisy level."""
    base = load_result(FIXTURES / "ablation.json").get("tiny-ablation/p2p-ckpt-cp2-T64-fwd")
    fast = [[0.0100, 0.0101, 0.0102, 0.0100], [0.0101, 0.0100, 0.0103, 0.0101]]
    slow = [[0.0190, 0.0191, 0.0192, 0.0190], [0.0205, 0.0206, 0.0207, 0.0205]]
    busy = Contention(foreign=0.5, steal=0.0, load_before=2.0, load_after=2.0)
    rounds = [RoundResult(samples_s=fast)] * 2 + [RoundResult(samples_s=slow, contention=busy)]
    rounds += [RoundResult(samples_s=fast)]
    return dataclasses.replace(base, rounds=rounds)


def test_two_levels_show_as_two_groups_and_the_slow_round_and_rank_are_named():
    case = _bimodal()
    counts = [b.count for b in histogram([s for r in case.rounds for k in r.samples_s for s in k], bins=10)]
    assert counts[0] == 24 and counts[-1] == 4 and sum(counts) == 32 and 0 in counts[1:-1]
    lines = case_histogram(case, width=80, bins=10)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert lines[0].startswith("tiny-ablation/p2p-ckpt-cp2-T64-fwd: 32 passes (4 rounds x 4 repeats x 2")
    strips = [line for line in lines if line.lstrip().startswith("r") and "|" in line]
    assert [s.split()[0] for s in strips] == ["r1", "r2", "r3", "r4"]
    slow = strips[2]
    assert slow.endswith("|  contended") and "1" in slow.split("|")[1][-5:]  # rank 1 at the far right
    assert slow.split("|")[1].index("0") > len(slow.split("|")[1]) // 2  # rank 0 slow too, not as slow
    assert all(s.split("|")[1].rstrip()[-1] != " " and s.split("|")[1].strip() for s in strips)
    assert "1" not in strips[0].split("|")[1][40:]  # fast rounds sit at the left


def test_bins_go_log_where_a_stall_would_squash_the_rest():
    samples = [0.010 + 0.001 * i for i in range(10)] + [0.500]  # 10-19 ms, and one stalled pass at 500 ms
    counts = [b.count for b in histogram(samples, bins=12)]
    assert counts[:2] == [4, 6] and counts[-1] == 1  # linear bins of 41 ms would hold all ten in one
    assert "(bins equal on a log scale)" in " ".join(
        case_histogram(dataclasses.replace(_bimodal(), rounds=[RoundResult(samples_s=[samples])]), 80)[:2]
    )


def test_bench_hist_prints_every_case_or_those_named(tmp_path: Path, capsys):
    path = tmp_path / "bimodal.json"
    run = load_result(FIXTURES / "ablation.json")
    save_result(dataclasses.replace(run, cases=[_bimodal(), *run.cases[:2]]), path)
    out = io.StringIO()
    assert hist_command.run(str(path), console=Console(file=out, width=80)) == 0
    text = out.getvalue()
    assert text.count("passes (") == 3 and all(len(line) <= 80 for line in text.splitlines())
    assert main(["hist", str(path), "--case", "ulysses-cp1-T64-fwd"]) == 0
    assert capsys.readouterr().out.count("passes (") == 1
    assert main(["hist", str(path), "--filter", "cp=2"]) == 0
    assert "p2p-ckpt-cp2-T64-fwd: 32 passes" in capsys.readouterr().out
    assert main(["hist", str(path), "--case", "p2p-cp9"]) == 1
    assert capsys.readouterr().err.startswith("error: --case p2p-cp9: no such case in")
    with pytest.raises(UserError, match="no measured case to show after --filter"):
        hist_command.run(str(path), filters=["cp=8"])
