"""Names for new files and folders that never reuse an existing one: result files (`result_filename`),
chart and profile folders (and `write_new` for a file that a command is told to write, such as `bench export
--out`, once bench.results.outputs has checked it). Names made from the time have one-second resolution, so
a taken name gets -2, -3, ... instead."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

from bench.errors import UserError
from bench.suite.loader import display


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+]+", "-", text).strip("-.") or "x"


def result_filename(created: datetime.datetime, branch: str, commit: str, name: str) -> str:
    """`<YYYYmmdd-HHMMSS>-<branch>-<shortcommit>-<name>.json`, with unsafe characters replaced by '-'."""
    return f"{created:%Y%m%d-%H%M%S}-{_slug(branch)}-{_slug(commit[:8])}-{_slug(name)[:80]}.json"


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


def new_charts_folder(results_dir: Path) -> Path:
    """A new folder <results_dir>/plots-<date>-<time>/ (-2, -3, ... when taken): where charts go unless a
    folder is named."""
    return new_folder(results_dir / f"plots-{datetime.datetime.now():%Y%m%d-%H%M%S}")


def profile_folder(
    results_dir: Path, case_key: str, *, branch: str, commit: str, run_id: str | None = None
) -> Path:
    """Where `bench profile` writes a case's traces unless told: <results_dir>/profiles/<date>-<branch>-
    <commit>-<case key>, the first free of -2, -3, ... (`create_folder` claims it once the case has passed
    the checks); under torchrun `run_id` (the job's run id) replaces the date, so that every rank (each
    with its own clock) names the same folder, which is then not numbered."""
    name = result_filename(datetime.datetime.now(), branch, commit, case_key).removesuffix(".json")
    if run_id is not None:
        stamp = "-".join(name.split("-", 2)[:2])  # <YYYYmmdd>-<HHMMSS>
        return results_dir / "profiles" / name.replace(stamp, run_id, 1)
    return free_path(results_dir / "profiles" / name)


def create_folder(path: Path, *, claim: bool) -> None:
    """Create the folder `path` and those above it before any rank writes there; `claim` (a name that
    free_path found free): it must still be. UserError, with the fix, when it cannot be made."""
    try:
        path.mkdir(parents=True, exist_ok=not claim)
    except FileExistsError:
        if claim and path.is_dir():
            raise UserError(
                f"{display(path)}: another command took this folder meanwhile; run the command again"
            ) from None
        raise UserError(
            f"{display(path)}: cannot create the folder (a file is in the way); give --output DIR"
        ) from None
    except OSError as exc:
        raise UserError(
            f"{display(path)}: cannot create the folder ({exc.strerror}); give --output DIR"
        ) from None
