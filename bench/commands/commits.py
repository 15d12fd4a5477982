"""`bench run --commits A..B`: a backfill, the cases on every commit of a range, one result file per commit
under the history folder (bench.launch.backfill), for `bench history` to draw."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from bench.commands.session import CaseChoice
from bench.console import console as default_console
from bench.errors import UserError, first_line
from bench.launch import backfill, interleave
from bench.launch.gitrefs import RefSide, repo_root
from bench.suite.loader import display


def run_commits(
    choice: CaseChoice,
    commits: Sequence[str],
    *,
    machine: str | None = None,
    history_dir: str | None = None,
    console: Console | None = None,
    runner: backfill.Runner = interleave.run_on_side,
) -> int:
    """`bench run --commits`: the cases on every commit (bench.launch.backfill). Exit 0 when every commit
    ran, 2 when some failed (recorded; the others ran), 130 when interrupted (run it again to continue)."""
    console = console or default_console
    repo = repo_root(Path.cwd())
    if repo is None:
        raise UserError(f"--commits: {Path.cwd()} is not in a git checkout; run from inside the repository")
    chosen = choice.choose()
    suite, selections = chosen.suite, chosen.selections
    sides = backfill.resolve_commits(repo, commits)
    root = Path(history_dir) if history_dir else suite.results_dir / "history"
    folder = backfill.history_folder(root, machine or backfill.default_machine(), selections)
    cases = sum(len(s.cases) for s in selections)
    console.print(
        f"backfill: {cases} cases on {len(sides)} commits, one file each in {escape(display(folder))}"
    )

    def report(i: int, side: RefSide, what: str) -> None:
        head = f"[{i + 1}/{len(sides)}] {side.commit[:8]}"
        if what == "running":
            console.print(f"{head} running", style="dim")
        elif what in ("ok", "skipped"):
            console.print(f"{head} {what}" + (" (its file is complete)" if what == "skipped" else ""))
        else:
            console.print(f"{head} [red]failed[/]: {escape(first_line(what))}")

    try:
        outcome = backfill.backfill(
            selections,
            suite,
            repo,
            sides,
            folder,
            sets=choice.sets,
            device=choice.device,
            on_commit=report,
            runner=runner,
        )
    except KeyboardInterrupt:
        console.print(
            f"[yellow]interrupted[/]: the commits done are in {escape(display(folder))}; run the same "
            "command again to continue (complete commits are skipped, a partial one resumed)"
        )
        return 130
    console.print(
        f"backfill: {len(outcome.ran)} ran, {len(outcome.skipped)} already done, {len(outcome.failed)} "
        f"failed; `bench history {escape(display(folder))}` draws them"
    )
    return 2 if outcome.failed else 0
