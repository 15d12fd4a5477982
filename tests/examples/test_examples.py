"""examples/: each runs as a user runs it, `torchrun --nproc-per-node 2 examples/<file>.py` on CPU ranks over
gloo (real torchrun from this environment, a free port, a bounded time), and checks itself against one
device (a file exits non-zero when CP disagrees); the README's library snippet is the library example's
heart, line for line (issue 46: the snippet failed with NameError: cp_group)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TORCHRUN = Path(sys.executable).parent / "torchrun"
TIMEOUT_S = 240
"""A few seconds each on 2 idle cores; generous for a loaded CI runner."""

OUTPUTS = {
    "library.py": r"y \(1, 1024, 128\) from 512 tokens a rank: rel-L2 \d\.\de-\d\d against one device",
    "model.py": r"2 ranks, p2p: loss \d+\.\d{4} \(one device \d+\.\d{4}\); largest gradient rel-L2 .*; one "
    r"AdamW step taken",
    "backend.py": r"2 ranks, scan over __main__\.token_loop: rel-L2 against one device o \S+, dq \S+",
}


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(OUTPUTS)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.multirank
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_an_example_runs_under_torchrun_on_two_cpu_ranks(name: str, tmp_path: Path):
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    argv = [str(TORCHRUN), "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    argv += ["--master-port", str(_free_port()), str(EXAMPLES / name)]
    # from another folder: an example needs nothing of the checkout but the installed packages
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(OUTPUTS[name], done.stdout), done.stdout


def _readme_snippet() -> str:
    """The python block of the README's "The library in a few lines"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The library in a few lines", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def _heart(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text.split("# --- readme: start\n", 1)[1].split("# --- readme: end\n", 1)[0]


def test_the_readme_snippet_is_the_library_examples_heart():
    assert _readme_snippet() == _heart(EXAMPLES / "library.py")
