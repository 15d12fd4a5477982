"""Backfill: the selected cases run on each commit of a range, one result file per commit, a folder per
machine (`bench run SCENARIO --commits A..B`; `bench history` reads the folders).

    <history dir>/<machine>/<scenarios>/<commit[:12]>.json          what the commit's bench measured
    <history dir>/<machine>/<scenarios>/<commit[:12]>.failed.json   why the commit's bench could not run

Each commit is checked out in a temporary worktree (bench.launch.gitrefs) and runs the staged definitions
with its own code (bench.launch.interleave: every commit runs the same scenario and suite files, copied once
from the working tree). Resumable: a commit whose file holds every planned case with all its rounds is
skipped, a partial file is continued (--resume), so that a backfill stopped by Ctrl-C picks up where it
stopped. A commit whose bench cannot run the definitions (it predates a key, or its code is broken) is
recorded as failed and the range goes on; a later backfill tries it again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.errors import UserError
from bench.launch import interleave
from bench.launch.gitrefs import RefSide, resolve_side, worktree
from bench.launch.interleave import Checkout, Staged
from bench.results.env import commit_metadata, now_iso, run_git
from bench.results.history import FAILED_SUFFIX
from bench.results.store import load_result
from bench.suite.loader import Suite
from bench.suite.selection import Selection

Runner = Callable[..., object]
"""Runs a checkout's rounds (interleave.run_on_side; a test hook)."""


def resolve_commits(repo: Path, specs: Sequence[str]) -> list[RefSide]:
    """The commits of `specs`, oldest first: `A..B` is every commit reachable from B and not from A along
    first parents (`git rev-list --reverse --first-parent`, the line a branch's history draws), anything
    else one ref; duplicates are kept once. UserError for a range or ref git does not know."""
    out: dict[str, RefSide] = {}
    for spec in specs:
        if ".." not in spec:
            side = resolve_side(spec, repo)
            if not isinstance(side, RefSide):
                raise UserError(f"--commits {spec}: is a file; give git refs or a range A..B")
            out.setdefault(side.commit, side)
            continue
        listed = run_git(repo, "rev-list", "--reverse", "--first-parent", spec)
        if listed.returncode != 0:
            problem = (listed.stderr.strip().splitlines() or ["no message"])[-1]
            raise UserError(
                f"--commits {spec}: git rev-list failed ({problem}); give a range such as HEAD~9..HEAD"
            )
        commits = listed.stdout.split()
        if not commits:
            raise UserError(f"--commits {spec}: the range holds no commit; the older end goes first (A..B)")
        for commit in commits:
            out.setdefault(commit, RefSide(spec=commit[:8], commit=commit))
    return list(out.values())


@dataclass(slots=True)
class BackfillOutcome:
    """What a backfill did, commit by commit (short hashes)."""

    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Already complete in the folder."""
    failed: list[str] = field(default_factory=list)


def _complete(path: Path, staged: Staged) -> bool:
    """Whether `path` holds every planned case with all its rounds (ok), or as failed."""
    if not path.exists():
        return False
    run = load_result(path)
    for planned in staged.plan:
        result = run.get(planned.case.key())
        if result is None or (result.status == "ok" and len(result.rounds) < planned.case.rounds):
            return False
    return True


def _write_failure(path: Path, record: dict[str, object]) -> None:
    """The failure record, atomically (a temporary file, then os.replace)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def backfill(
    selections: Sequence[Selection],
    suite: Suite,
    repo: Path,
    commits: Sequence[RefSide],
    folder: Path,
    *,
    sets: Sequence[str] = (),
    device: str | None = None,
    on_commit: Callable[[int, RefSide, str], None] = lambda i, side, what: None,
    runner: Runner = interleave.run_on_side,
) -> BackfillOutcome:
    """Run the selected cases on every commit into `folder` (module docstring). `on_commit(i, side, what)`
    reports each commit as it is reached: "skipped", "running", then "ok" or the failure's message.
    KeyboardInterrupt propagates once the commit's worktree is removed; its partial file is kept."""
    folder.mkdir(parents=True, exist_ok=True)
    name = "+".join(s.scenario.name for s in selections if s.cases)
    outcome = BackfillOutcome()
    with tempfile.TemporaryDirectory(prefix="bench-backfill-") as tmp:
        # one definition for every commit; runs of their own (no session id: not a compare)
        staged = dataclasses.replace(
            interleave.stage(selections, suite, Path(tmp) / "definitions"), session=""
        )
        for i, side in enumerate(commits):
            short = side.commit[:12]
            output, failure = folder / f"{short}.json", folder / f"{short}{FAILED_SUFFIX}"
            if _complete(output, staged):
                outcome.skipped.append(short)
                on_commit(i, side, "skipped")
                continue
            on_commit(i, side, "running")
            with worktree(repo, side.commit, Path(tmp) / short) as root:
                checkout = Checkout(
                    name=f"commit {i + 1}/{len(commits)}", side=side, root=root, output=output
                )
                try:
                    runner(
                        checkout,
                        staged,
                        resume=output.exists(),
                        stop_after=staged.rounds,
                        sets=sets,
                        device=device,
                    )
                except UserError as exc:
                    date, subject = commit_metadata(repo, side.commit)
                    record = {"name": name, "commit": side.commit, "date": date, "subject": subject}
                    _write_failure(failure, {**record, "created_at": now_iso(), "error": str(exc)})
                    outcome.failed.append(short)
                    on_commit(i, side, str(exc))
                    continue
            failure.unlink(missing_ok=True)
            outcome.ran.append(short)
            on_commit(i, side, "ok")
    return outcome


def default_machine() -> str:
    """The machine folder's name when none is given: this host's name."""
    return socket.gethostname() or "this-machine"


def history_folder(root: Path, machine: str, selections: Sequence[Selection]) -> Path:
    """<root>/<machine>/<scenario names joined by '+'>."""
    return root / machine / "+".join(s.scenario.name for s in selections if s.cases)
