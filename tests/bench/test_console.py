"""bench.console.CaseProgress: a bar with an ETA on a terminal, [i/N] on every case line elsewhere."""

from __future__ import annotations

import io

from rich.console import Console

from bench.console import CaseProgress


def _run(console: Console, lines: list[str]) -> None:
    with CaseProgress(console, len(lines)) as progress:
        for i, line in enumerate(lines):
            progress.start(f"scenario/case-{i} [not markup]")
            progress.done(line)


def test_lines_are_numbered_when_the_output_is_not_a_terminal() -> None:
    out = io.StringIO()
    _run(Console(file=out, force_terminal=False, width=120), ["ok      a", "[red]failed[/] b", "ok      c"])
    lines = [line for line in out.getvalue().splitlines() if line]
    assert lines == ["[1/3] ok      a", "[2/3] failed b", "[3/3] ok      c"]


def test_a_terminal_gets_the_bar_with_an_eta_and_plain_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with CaseProgress(console, 2) as progress:
        progress.start("scenario/first")
        console.file.flush()
        progress._bar.refresh()  # draw once, as the live display would
        drawn = out.getvalue()
        progress.done("ok      first")
        progress.done("ok      second")
    assert "scenario/first" in drawn and "0/2" in drawn and "eta" in drawn
    text = out.getvalue()
    assert "ok      first" in text and "[1/2]" not in text
