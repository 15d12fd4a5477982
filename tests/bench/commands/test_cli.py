"""The command line's front door: `bench`, `bench --help` and every subcommand's --help print and exit 0."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from bench.cli import build_parser, main
from bench.commands import COMMANDS, summary


def _command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path the parser knows: (), ("run",), ("model",), ("model", "table"), ..."""
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths += _command_paths(child, (*prefix, name))
    return paths


COMMAND_PATHS = _command_paths(build_parser())


def test_every_subcommand_is_walked():
    names = {path[0] for path in COMMAND_PATHS if path}
    assert {"run", "compare", "gate", "model", "show", "verify"} <= names
    assert any(len(path) == 2 for path in COMMAND_PATHS)  # bench model's actions


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda path: " ".join(("bench", *path)))
def test_help_prints_and_exits_0(path: tuple[str, ...], capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: bench"), out[:200]


def test_bare_bench_lists_the_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "run" in out and "compare" in out and "interval" in out  # compare's help, its "95%" intact


def test_python_m_bench_help():
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: bench") and "Traceback" not in done.stderr


def test_bench_help_starts_without_torch_and_lists_every_command():
    """Issue 37: `bench --help` imported torch (9-13 s on a busy machine). The commands' modules load only
    when one runs; the listing reads each HELP from its source, the same text the module holds."""
    code = (
        "import sys\nfrom bench.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False")
    for command in COMMANDS:
        assert summary(command.NAME) == command.HELP
        assert command.NAME in out
