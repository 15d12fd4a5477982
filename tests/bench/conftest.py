"""Fixtures for the bench tests: a throwaway suite (bench.yaml + scenarios/) in a temporary folder."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from tiny import TINY_LAYER_YAML

TINY_SCENARIO = f"""\
description: tiny layer for tests
{TINY_LAYER_YAML}warmup: 1
repeat: 2
cp: [1, 2]
seq_len: [64]
mode: [ulysses, p2p]
checkpoint: [true]
pass: [forward_backward]
"""

SUITE = """\
device: cpu
warmup: 1
repeat: 2
rounds: 2
compare_rounds: 2
timeout_s: 60
default_scenario: tiny
"""


@pytest.fixture
def suite_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A suite folder holding bench.yaml and scenarios/tiny.yaml; the working directory during the test."""
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "bench.yaml").write_text(SUITE)
    (tmp_path / "scenarios" / "tiny.yaml").write_text(TINY_SCENARIO)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def write_scenario(suite_dir: Path) -> Callable[[str, str], Path]:
    """write_scenario(name, yaml_text) -> path of scenarios/<name>.yaml (text dedented)."""

    def write(name: str, text: str) -> Path:
        path = suite_dir / "scenarios" / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return path

    return write
