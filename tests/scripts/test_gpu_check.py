"""scripts/gpu_check.sh: its dry run prints every command the GPU check would run and names each tool it
lacks (issue 45), on a PATH made here so that what is found does not depend on the host; and the script
keeps to bash 4.2 (no "${a[@]}" of a possibly empty array under `set -u`, which bash before 4.4 calls
unbound)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
COMMANDS = [
    "+ date -u",
    "+ nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv",
    "+ python - (python, torch, CUDA and NCCL versions",
    "+ python -m bench doctor --device cuda --timeout 300",
    "+ python -m bench run gpu-smoke --set 'seq_len=[8192]' --set rounds=1 --set warmup=1 --set repeat=3",
    "+ python -m bench show",
]
"""The lines of the dry run, in order (each a prefix of its line)."""


def _dry_run(tmp_path: Path, tools: dict[str, str]) -> subprocess.CompletedProcess:
    """The dry run with only `tools` (name -> path) on PATH, plus what bash needs to find the checkout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, target in {"dirname": shutil.which("dirname"), **tools}.items():
        # a wrapper, not a link: a virtual environment's python finds its packages from the path it runs as
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = str(bin_dir)
    return subprocess.run(
        [shutil.which("bash"), str(SCRIPT), "--dry-run", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _in_order(lines: list[str], prefixes: list[str]) -> bool:
    at = 0
    for line in lines:
        if at < len(prefixes) and line.startswith(prefixes[at]):
            at += 1
    return at == len(prefixes)


def test_the_dry_run_prints_every_command_and_names_a_missing_tool(tmp_path: Path):
    proc = _dry_run(tmp_path, {"python": sys.executable})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _in_order(proc.stdout.splitlines(), COMMANDS), proc.stdout
    assert f"--output {tmp_path}/out/gpu-smoke.json" in proc.stdout
    assert "missing: nvidia-smi (NVIDIA's driver tools, on PATH)" in proc.stderr.splitlines()
    assert "missing: python" not in proc.stderr and "missing: torch" not in proc.stderr
    assert "missing: bench's dependencies" not in proc.stderr  # this environment has them all
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_a_found_nvidia_smi_is_not_named(tmp_path: Path):
    proc = _dry_run(tmp_path, {"python": sys.executable, "nvidia-smi": shutil.which("true")})
    assert "nvidia-smi" not in proc.stderr, proc.stderr
    cuda_build = bool(__import__("torch").version.cuda)
    # with a CUDA build of torch every tool is found; a CPU build is the one thing left missing
    assert proc.returncode == (0 if cuda_build else 1), proc.stdout + proc.stderr
    assert ("missing: a CUDA build of torch" in proc.stderr) == (not cuda_build)


def test_without_python_the_dry_run_says_so_and_still_lists_the_commands(tmp_path: Path):
    proc = _dry_run(tmp_path, {})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0].startswith("missing: python (on PATH")
    assert _in_order(proc.stdout.splitlines(), COMMANDS), proc.stdout


def test_every_array_expansion_holds_on_bash_4_2():
    """`set -u` with "${a[@]}" of an empty array stops bash 4.2 and 4.3 ('unbound variable'; bash 4.4's NEWS
    lists the change); ${a[@]+"${a[@]}"} expands to nothing on every version."""
    text = "\n".join(line for line in SCRIPT.read_text().splitlines() if not line.lstrip().startswith("#"))
    assert "set -uo pipefail" in text
    bare = [m.group(0) for m in re.finditer(r'(?<!\+)"\$\{(\w+)\[@\]\}"', text)]
    guarded = re.findall(r'\$\{(\w+)\[@\]\+"\$\{\1\[@\]\}"\}', text)
    assert bare == [], f"unguarded array expansions (bash < 4.4 under set -u): {bare}"
    assert guarded == ["filter"]
