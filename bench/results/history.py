"""The result files of many commits, found and read: what a history is made of (bench.judge.history judges
them; `bench history` shows them).

    found = load_runs([Path("results/history")])    # files and folders, searched for *.json
    found.runs, found.skipped                        # a Run per result file and backfill failure; the rest

A run is one result file, or a backfill's record of a commit whose bench could not run (bench.launch.backfill
writes `<commit>.failed.json`). Its commit carries the commit's date and subject, from the file, else (a file
from before the environment recorded them) from the checkout's git. A JSON file that is not a result file
(a profile's trace, an export, a site's data: no `schema_version`) is skipped, and listed in `skipped` for
the one note the command prints; a result file that cannot be read stops the loading, with its error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.errors import UserError
from bench.results.env import commit_metadata
from bench.results.store import RunResult, is_result_text, parse_result, read_result_text

FAILED_SUFFIX = ".failed.json"
"""A backfill's record of a commit whose bench could not run: {name, commit, date, subject, created_at,
error}."""


@dataclass(frozen=True, slots=True)
class Commit:
    commit: str
    date: str | None
    """Committer date, ISO 8601 (None: unknown; the run's own date orders it)."""
    subject: str | None

    @property
    def short(self) -> str:
        return self.commit[:8]


@dataclass(frozen=True, slots=True)
class Run:
    """One result file of a commit, or the record of a commit whose bench could not run."""

    commit: Commit
    created_at: str
    path: Path
    run: RunResult | None
    """None: the commit's bench could not run (`error`)."""
    error: str | None = None
    name: str = ""
    """What ran: the scenario names joined by '+' (RunResult.name; a failure record's `name`)."""

    @property
    def date(self) -> str:
        """The commit's date, else the run's (ISO 8601)."""
        return self.commit.date or self.created_at

    @property
    def order(self) -> tuple[str, str]:
        return (self.date, self.created_at)

    @property
    def scenarios(self) -> list[str]:
        """The scenarios it ran (or, failed, was to run)."""
        return list(self.run.scenarios) if self.run is not None else self.name.split("+")


@dataclass(frozen=True, slots=True)
class Loaded:
    """What `load_runs` found under its paths."""

    runs: list[Run]
    """Every result file and failure record, in the order found (by path)."""
    skipped: list[Path]
    """JSON files that are not result files (no schema_version), left out."""


def find_files(paths: Iterable[Path]) -> list[Path]:
    """The files named, and every *.json under the folders named (sorted; hidden files left out: a write in
    progress). UserError for a path that does not exist."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out += sorted(p for p in path.rglob("*.json") if not p.name.startswith("."))
        elif path.is_file():
            out.append(path)
        else:
            raise UserError(
                f"{path}: no such file or folder; give result files or the folders that hold them"
            )
    return out


def read_failure(path: Path) -> Run:
    """A backfill's failure record as a run (`name` its scenarios); UserError when it is not one."""
    try:
        data = json.loads(path.read_text())
        commit = Commit(data["commit"], data.get("date"), data.get("subject"))
        return Run(commit, data["created_at"], path, None, data["error"], data["name"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path}: not a backfill failure record ({exc}); remove it or re-run the backfill"
        ) from None


def read_run(path: Path, text: str) -> Run:
    """A result file (its `text`) as a run of its commit; UserError when it cannot be read."""
    run = parse_result(path, text)
    e = run.environment
    date, subject = e.git_date, e.git_subject
    if date is None:  # a file from before the environment recorded it: ask the checkout, if it knows
        date, subject = commit_metadata(Path.cwd(), e.git_commit)
    return Run(Commit(e.git_commit, date, subject), run.created_at, path, run, name=run.name)


def load_runs(paths: Sequence[Path]) -> Loaded:
    """Every result file and failure record under `paths` (files, or folders searched for *.json), the other
    JSON files skipped. UserError when no result file is found, or for one that cannot be read."""
    runs: list[Run] = []
    skipped: list[Path] = []
    for path in find_files(paths):
        if path.name.endswith(FAILED_SUFFIX):
            runs.append(read_failure(path))
            continue
        text = read_result_text(path)
        if not is_result_text(text):
            skipped.append(path)
            continue
        runs.append(read_run(path, text))
    if not any(r.run is not None for r in runs):
        also = f" ({len(skipped)} JSON files there are not result files)" if skipped else ""
        raise UserError(
            f"no result file under {', '.join(map(str, paths))}{also}; give the folders `bench run` wrote"
        )
    return Loaded(runs, skipped)


def skipped_note(skipped: Sequence[Path], shown: int = 3) -> str | None:
    """One line naming the files left out as not result files (the first `shown` of them), or None."""
    if not skipped:
        return None
    names = ", ".join(str(p) for p in skipped[:shown]) + (" ..." if len(skipped) > shown else "")
    files = "file that is" if len(skipped) == 1 else "files that are"
    return (
        f"skipped {len(skipped)} JSON {files} not result files (no schema_version: traces, exports): {names}"
    )
