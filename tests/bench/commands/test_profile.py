"""`bench profile`: a real 2-rank profile (a valid Chrome trace per rank, bytes == the model, memory by kind)
and choosing exactly one case (the trace analysis: tests/bench/profiling)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny import TINY_LAYER_YAML

from bench.cli import main
from bench.commands import profile as profile_command

PROFILE = f"""\
{TINY_LAYER_YAML}cp: [2]
seq_len: [64]
mode: [ulysses, p2p]
checkpoint: [true]
pass: [forward_backward]
"""


@pytest.mark.multirank
def test_profile_writes_a_trace_per_rank_and_the_bytes_match_the_model(
    suite_dir: Path, write_scenario, capsys
):
    write_scenario("p", PROFILE)
    out = suite_dir / "prof"
    assert main(["profile", "p", "--case", "mode=p2p", "--steps", "2", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "profiling p/p2p-ckpt-cp2-T64-fwd_bwd on 2 ranks (cpu)" in printed
    assert "time per step on each rank (mean of 2 profiled steps)" in printed and "waiting" in printed
    assert "straggler: rank " in printed and "behind it: " in printed
    assert "peak total" in printed and "meter: mem_tracker" in printed
    for rank in (0, 1):
        trace = json.loads((out / f"rank{rank}.json").read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert "bench.step" in names and "c10d::send" in names and "c10d::recv_" in names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["traces"] == ["rank0.json", "rank1.json"]
    rows = summary["communication"]
    assert {(r["rank"], r["kind"]) for r in rows} == {
        (r, k)
        for r in (0, 1)
        for k in ("all_gather", "halo", "p2p")  # the header's all-gather, the halo, the state chain
    }
    assert all(r["match"] and r["counted"] == r["model"] for r in rows)
    p2p = next(r for r in rows if r["rank"] == 0 and r["kind"] == "p2p")
    assert p2p["counted"]["sent"] == 1 * 4 * 8 * 8 * 4  # one fp32 state [B, Hv, K, V] each way
    for b in summary["breakdown"]:
        parts = (
            b["compute_us"]
            + b["waiting_us"]
            + sum(
                v
                for k, v in b.items()
                if k.endswith("_us") and k not in ("step_us", "compute_us", "waiting_us")
            )
        )
        assert b["step_us"] > 0 and parts == pytest.approx(b["step_us"])
        assert b["p2p_us"] >= 0 and b["halo_us"] >= 0  # the halo exchange is told apart from all_to_all
        assert "all_to_all_us" not in b  # p2p mode runs no Ulysses exchange
    for m in summary["memory"]:
        assert (
            m["error"] is None
            and m["bytes"]["Parameter"] > 0
            and m["bytes"]["Total"] >= m["bytes"]["Parameter"]
        )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--case", "mode=ring"], "--case mode=ring matches none of the 2 cases of p; see `bench list p`"),
        (
            ["--case", "cp=2"],
            "--case cp=2 matches 2 cases of p (ulysses-cp2-T64-fwd_bwd, p2p-ckpt-cp2-T64-fwd_bwd); narrow "
            "it to one, e.g. --case ulysses-cp2-T64-fwd_bwd",
        ),
        (["--case", "mode=p2p", "--steps", "0"], "--steps 0: give a positive number of steps"),
    ],
)
def test_exactly_one_case_must_match(suite_dir: Path, write_scenario, capsys, argv, message):
    write_scenario("p", PROFILE)
    assert main(["profile", "p", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_output_that_would_overwrite_is_refused_before_any_rank_starts(
    suite_dir: Path, write_scenario, capsys, monkeypatch
):
    write_scenario("p", PROFILE)

    def no_launch(*args, **kwargs):
        raise AssertionError("ranks launched")

    monkeypatch.setattr(profile_command.Session, "launcher", no_launch)
    (suite_dir / "trace.json").write_text("{}")
    (suite_dir / "old").mkdir()
    (suite_dir / "old" / "summary.json").write_text("{}")
    for output, message in [
        ("trace.json", "--output trace.json: is a file; give a folder for the traces (a new one)"),
        ("old", "--output old: already holds a profile (summary.json or rank<r>.json), which this one would"),
    ]:
        assert main(["profile", "p", "--case", "mode=p2p", "--output", output]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert (suite_dir / "trace.json").read_text() == "{}"
