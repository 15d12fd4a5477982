"""`git` in a throwaway repository of a test, as a test identity (no global git config needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """`git ARGS` in `repo`; its output, stripped. CalledProcessError when git fails."""
    out = subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()
