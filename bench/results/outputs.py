"""The one guard for what a command writes where it is told to (`--out`, `--output`, `--save-dir`,
`--charts`, `--markdown`): no command replaces, with something else,

- a file it is reading (`bench export r.json --out r.json --replace`),
- a result file (one this bench reads: JSON with a top-level `schema_version`, bench.results.store),
- a history file (a backfill's record of a commit whose bench could not run, bench.results.history),
- a file committed to git (a baseline: results/*.md, plots/*.png, a links file) unless the command writes
  that kind of file (`bench report ... --out results/cpu-scaling-baseline.md` regenerates the committed
  report; `bench export ... --out results/cpu-scaling-baseline.md --replace` is refused).

Each refusal is one line: the flag, the file, why, and what to do. Whether a command may replace an ordinary
existing file (export with --replace, report, plot's charts of the same name) stays the command's own rule;
this guard runs first, before any work.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench.errors import UserError
from bench.results.env import run_git
from bench.results.history import FAILED_SUFFIX
from bench.results.store import is_result_text

RESULT_FILE = "a result file"
HISTORY_FILE = "a history file (a backfill's record of a commit whose bench could not run)"


def check_output_file(
    out: str | Path,
    *,
    flag: str,
    reading: Sequence[str | Path] = (),
    suffixes: Sequence[str] = (),
    hint: str = "give another name",
) -> Path:
    """`out` as a Path, once nothing there is protected from what the command writes; UserError (`flag out:
    why; hint`) otherwise. `reading`: the files the command reads. `suffixes`: the kinds of file it writes
    (".csv", ".md", ...), which a committed file of that kind may be replaced by. A folder, or a file that
    does not exist, passes (the command says what it does with those)."""
    path = Path(out)
    if not path.is_file():
        return path
    for source in reading:
        if _same(path, Path(source)):
            raise UserError(f"{flag} {out}: is one of the files this command reads; {hint}")
    kind = protected_kind(path)
    if kind is not None:
        raise UserError(f"{flag} {out}: is {kind}, which no command writes over; {hint}")
    if path.suffix.lower() not in {s.lower() for s in suffixes} and committed(path):
        writes = "/".join(suffixes) or "another kind of"
        raise UserError(
            f"{flag} {out}: is committed to git (a baseline), and this command would replace it with a "
            f"{writes} file; {hint}"
        )
    return path


def check_output_folder(out: str | Path, *, flag: str, hint: str) -> Path:
    """`out` as a Path when it is a folder or does not exist yet; UserError (`flag out: is a file; hint`,
    saying what kind of file) when it is a file."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        kind = protected_kind(path) if path.is_file() else None
        raise UserError(f"{flag} {out}: is {kind or 'a file'}{', not a folder' if kind else ''}; {hint}")
    return path


def protected_kind(path: Path) -> str | None:
    """What the existing file `path` is, when no command may write over it: a result file (its version) or a
    history file (RESULT_FILE, HISTORY_FILE); None for any other file, or one that cannot be read (the write
    then says why)."""
    if path.name.endswith(FAILED_SUFFIX):
        return HISTORY_FILE
    try:
        with path.open("rb") as f:
            opening = f.read(64)
            if not opening.lstrip().startswith(b"{"):  # neither JSON object: not read further (a large CSV)
                return None
            text = (opening + f.read()).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return RESULT_FILE if is_result_text(text) else None


def committed(path: Path) -> bool:
    """Whether git tracks `path` in the checkout that holds it (False outside a checkout, or without git)."""
    try:
        done = run_git(path.parent, "ls-files", "--error-unmatch", "--", path.name, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()
