"""Git refs for `bench compare`: tell a result file from a ref, and check refs out in temporary worktrees.

A side of a comparison is a result file when the path exists, else a git ref of the repository around the
working directory (anything `git rev-parse --verify REF^{commit}` accepts: a branch, tag, hash, HEAD~2).
A ref is checked out with `git worktree add --detach` into a temporary folder and removed afterwards, also
on an error or Ctrl-C, so the user's checkout is never touched. A ref is a commit: uncommitted changes of
the working tree are not part of it.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.errors import UserError
from bench.results.env import run_git


@dataclass(frozen=True, slots=True)
class FileSide:
    """A side given as a result file."""

    spec: str
    """As the user wrote it."""
    path: Path


@dataclass(frozen=True, slots=True)
class RefSide:
    """A side given as a git ref."""

    spec: str
    """As the user wrote it (main, HEAD~1, a tag, a hash)."""
    commit: str
    """The full hash it resolves to."""

    @property
    def label(self) -> str:
        short = self.commit[:8]
        return self.spec if self.spec.startswith(short) else f"{self.spec} ({short})"


Side = FileSide | RefSide


def repo_root(cwd: Path) -> Path | None:
    """The top of the git checkout holding `cwd`, or None outside one (or without git)."""
    try:
        out = run_git(cwd, "rev-parse", "--show-toplevel", timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 else None


def resolve_side(spec: str, cwd: Path) -> Side:
    """A result file (the path exists), else a git ref; UserError when it is neither."""
    path = Path(spec)
    if path.is_file():
        return FileSide(spec=spec, path=path)
    if path.exists():
        raise UserError(f"{spec}: is a folder; give a result file (.json) or a git ref")
    repo = repo_root(cwd)
    if repo is None:
        raise UserError(
            f"{spec}: no such result file, and not a git ref either ({cwd} is not in a git checkout); "
            "give a result file that `bench run` wrote, or run from inside the repository to compare refs"
        )
    out = run_git(repo, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    if out.returncode != 0 or not out.stdout.strip():
        raise UserError(
            f"{spec}: no such result file, and not a commit of {repo} (git rev-parse --verify failed); "
            "give a result file, or a branch, tag or commit (see `git log --oneline`)"
        )
    return RefSide(spec=spec, commit=out.stdout.strip())


@contextlib.contextmanager
def worktree(repo: Path, commit: str, path: Path) -> Iterator[Path]:
    """`commit` checked out (detached) at `path` for the duration of the block; removed afterwards."""
    out = run_git(repo, "worktree", "add", "--detach", str(path), commit, timeout=300)
    if out.returncode != 0:
        problem = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(
            f"git worktree add {path} {commit[:8]} failed ({problem}); check that the repository is not "
            "locked by another git process (a stale .git/index.lock) and that the disk has room"
        )
    try:
        yield path
    finally:
        # --force: the run leaves files (caches) in it; prune clears the record if removal half-failed.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            run_git(repo, "worktree", "remove", "--force", str(path), timeout=120)
            run_git(repo, "worktree", "prune", timeout=60)
