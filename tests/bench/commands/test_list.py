"""`bench list`: the suite's scenarios, or the validated cases of the named ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench.cli import main
from bench.commands import list as list_command
from bench.suite.loader import ConfigError


def rendered(*args, **kwargs) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    assert list_command.run(*args, console=console, **kwargs) == 0
    return console.export_text()


def test_lists_scenarios_with_case_counts_and_broken_files(suite_dir: Path, write_scenario):
    write_scenario("broken", "hidden_size: [\n")
    text = rendered()
    assert "tiny (default)" in text and "tiny layer for tests" in text
    tiny_row = next(line for line in text.splitlines() if "tiny (default)" in line)
    assert " 4 " in tiny_row and "cpu (suite)" in tiny_row
    assert "broken" in text and "malformed YAML" in text  # one broken file does not hide the others


def test_lists_expanded_cases_with_filter_and_estimate(suite_dir: Path):
    text = rendered(["tiny"], filters=["mode=p2p"])
    assert "tiny: 2 of 4 cases" in text
    assert "p2p-ckpt-cp1-T64-fwd_bwd" in text and "p2p-ckpt-cp2-T64-fwd_bwd" in text
    assert "ulysses" not in text and "MiB" in text


def test_list_validates_cases(suite_dir: Path):
    with pytest.raises(
        ConfigError, match=r"\(--set cp=\[3\]\): cp: case ulysses-cp3-T64-fwd_bwd: ulysses shards heads"
    ):
        list_command.run(["tiny"], sets=["cp=[3]"])


def test_list_through_the_cli(suite_dir: Path, capsys):
    assert main(["list", "tiny", "--set", "seq_len=[128]"]) == 0
    assert "ulysses-cp2-T128-fwd_bwd" in capsys.readouterr().out


def test_shipped_scenarios_list(capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[3])
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in (
        "cpu-smoke (default)",
        "cpu-scaling",
        "npu-cp4-32k",
        "npu-cp8-scaling",
        "npu-checkpoint-ablation",
    ):
        assert name in out
