"""Names for new files and folders that never reuse an existing one: result files, chart and profile
folders (and `write_new` for a file that a command is told to write, such as `bench export --out`). Names
made from the time have one-second resolution, so a taken name gets -2, -3, ... instead."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

from bench.errors import UserError


def numbered_paths(path: Path) -> Iterator[Path]:
    """`path`, then <stem>-2<suffix>, <stem>-3<suffix>, ...: the names to try for a new file or folder."""
    yield path
    for n in itertools.count(2):
        yield path.with_name(f"{path.stem}-{n}{path.suffix}")


def free_path(path: Path) -> Path:
    """The first of numbered_paths(path) that does not exist, for a name taken later (new_folder takes it
    at once)."""
    return next(p for p in numbered_paths(path) if not p.exists())


def new_folder(path: Path) -> Path:
    """Create and return the first of numbered_paths(path) that does not exist yet; mkdir claims it, so two
    commands never share one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    candidates = numbered_paths(path)
    while True:
        candidate = next(candidates)
        with contextlib.suppress(FileExistsError):
            candidate.mkdir()
            return candidate


def write_new(path: Path, text: str) -> None:
    """Write `text` to a new file at `path`: FileExistsError when the name is taken (the file is claimed
    with O_EXCL, so that nothing is ever written over an existing file)."""
    with path.open("x", encoding="utf-8", newline="") as f:
        f.write(text)


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path`, over an existing file at once (a temporary file beside it, renamed): a reader
    sees the old file or the new one, never half of one. Only for files a command was told by name to
    replace (`bench export --out FILE --replace`)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def check_out_folder(out: str, flag: str = "--out") -> None:
    """UserError when a charts folder given by name is an existing file."""
    if Path(out).exists() and not Path(out).is_dir():
        raise UserError(f"{flag} {out}: is a file; give a folder for the charts (it is created if missing)")


def new_charts_folder(results_dir: Path) -> Path:
    """A new folder <results_dir>/plots-<date>-<time>/ (-2, -3, ... when taken): where charts go unless a
    folder is named."""
    return new_folder(results_dir / f"plots-{datetime.datetime.now():%Y%m%d-%H%M%S}")
