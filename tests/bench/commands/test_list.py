"""`bench list`: the suite's scenarios, or the validated cases of the named ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench.cli import main
from bench.commands import list as list_command
from bench.errors import UserError
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


def test_cases_come_through_the_one_choice_of_every_command(suite_dir: Path):
    """Issue 47: list loaded the suite and selected cases itself, beside CaseChoice. Now a filter that
    keeps nothing is the one "no case left" message, and the scenario list counts each scenario's cases
    under the --set given, as `bench list NAME --set ...` lists them."""
    with pytest.raises(UserError, match=r"--filter seq_len=4096 matches none of the 4 cases of tiny; see"):
        list_command.run(["tiny"], filters=["seq_len=4096"])
    tiny_row = next(line for line in rendered(sets=["seq_len=[64,128]"]).splitlines() if "tiny" in line)
    assert " 8 " in tiny_row
    assert "tiny: 8 cases" in rendered(["tiny"], sets=["seq_len=[64,128]"])
