"""Short names for result files, resolved in one place for every command that reads one: `latest` is the
newest `bench run` file in the suite's results_dir, `latest~1` the one before it, `latest~N` N before
(pytest-benchmark's autosave ids, asv's result storage; the `~N` of git's revisions). `bench gate
--verify` asks for `bench verify` files, whose own sequence the same names count.

    bench show latest                   bench compare latest~1 latest
    bench export latest --out rows.csv  bench gate latest~1 latest --verify latest

A path that exists is always that file, so a file named `latest` in the working directory wins; any other
text is returned as given (a path the command then reports as missing, or a git ref). The files are the
result files directly in results_dir (not its compare-*, history or profiles folders), ordered by the time
in the name bench gives them (`<YYYYmmdd-HHMMSS>-...json`, bench.results.paths.result_filename), else by
when they were last written; only as many are read as it takes to find the one named.

A case of a file is named by its id, scenario/id or key (`find_case`: `bench show --case`, `bench hist
--case`).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from bench.errors import UserError, suggest
from bench.results.store import CaseResult, RunResult
from bench.results.verifications import run_name
from bench.suite.loader import display, load_suite

Kind = Literal["run", "verify"]
NAME = re.compile(r"latest(?:~(\d+))?")
"""`latest`, `latest~N`."""
_STAMP = re.compile(r"(\d{8}-\d{6})-")
_WRITTEN_BY = {"run": "`bench run`", "verify": "`bench verify`"}


def is_name(text: str) -> bool:
    """Whether `text` is a short name (and no file of that name exists)."""
    return NAME.fullmatch(text) is not None and not Path(text).exists()


def resolve_result(text: str, *, kind: Kind = "run", config: str | None = None) -> str:
    """The path of the result file `text` names (`latest`, `latest~N`: the newest `kind` file in the
    results_dir of the suite at `config`, or N before it), else `text` as given. UserError, naming the folder
    and what it holds, when there are not that many files."""
    match = NAME.fullmatch(text)
    if match is None or Path(text).exists():
        return text
    back = int(match[1] or 0)
    folder = load_suite(config).results_dir
    found = 0
    for path in _newest_first(folder):
        if _kind_of(path) == kind:
            if found == back:
                return str(display(path))
            found += 1
    held = f"holds {found} {_WRITTEN_BY[kind]} result file{'s' * (found != 1)}" if found else "holds none"
    if not folder.is_dir():
        held = "does not exist yet"
    raise UserError(
        f"{text}: the results folder {display(folder)} {held}, so `{text}` names none (results_dir in "
        f"bench.yaml sets the folder); give a result file's path"
    )


def _newest_first(folder: Path) -> Iterator[Path]:
    """The JSON files directly in `folder`, newest first (the time in bench's name, else the time written)."""
    if not folder.is_dir():
        return iter(())
    files = [p for p in folder.glob("*.json") if p.is_file() and not p.name.startswith(".")]
    return iter(sorted(files, key=_written, reverse=True))


def _written(path: Path) -> tuple[datetime.datetime, str]:
    stamp = _STAMP.match(path.name)
    if stamp is not None:
        try:
            return datetime.datetime.strptime(stamp[1], "%Y%m%d-%H%M%S"), path.name
        except ValueError:
            pass
    return datetime.datetime.fromtimestamp(path.stat().st_mtime), path.name


def _kind_of(path: Path) -> Kind | None:
    """run or verify, from the file's own fields; None for a file that is not a result file (an export, a
    broken file: such a file is never `latest`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or "schema_version" not in data:
        return None
    scenarios = list(data.get("scenarios") or {})
    names = {run_name(scenarios, train=train) for train in (False, True)}
    return "verify" if data.get("verifications") or data.get("name") in names else "run"


def find_case(run: RunResult, wanted: str, path: str) -> CaseResult:
    """The case of `run` (read from `path`) whose id, scenario/id or key is `wanted`; UserError listing close
    ids."""
    for result in run.cases:
        names = {result.case.case_id, f"{result.case.scenario}/{result.case.case_id}", result.key}
        if wanted in names:
            return result
    ids = [c.case.case_id for c in run.cases]
    raise UserError(f"--case {wanted}: no such case in {path}; {suggest(wanted, ids)}")
