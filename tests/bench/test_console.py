"""bench.console.CaseProgress: a bar with an ETA on a terminal, [i/N] on every case line elsewhere."""

from __future__ import annotations

import io

from rich.console import Console

from bench import console as console_module
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


def test_the_bar_counts_case_rounds_and_gives_a_time_left_from_the_first_one(monkeypatch) -> None:
    """Issue 46: the bar counted work units (`0/2936832`) and its ETA stayed blank for minutes (rich's own
    needs two updates within 30 s). It counts case-rounds; the time left is the pace of the work done
    (start-up included) times the work left, from the first finished case-round, counting down between."""
    clock = [100.0]
    monkeypatch.setattr(console_module.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with CaseProgress(console, 3, work=40.0, unit="case-rounds") as progress:
        progress.start("scenario/slow round 1")
        progress._bar.refresh()
        assert "0/3 case-rounds" in out.getvalue() and "eta -" in out.getvalue()
        assert progress.seconds_left() is None
        clock[0] += 50.0
        progress.done("ok      slow", work=10.0)  # 50 s for 10 of 40: 150 s left
        assert progress.seconds_left() == 150.0
        clock[0] += 30.0
        assert progress.seconds_left() == 120.0  # counting down until the next case-round
        progress._bar.refresh()
        assert "1/3 case-rounds" in out.getvalue() and "eta 2:00" in out.getvalue()
        clock[0] += 10.0
        progress.done("ok      fast", work=20.0)  # refined: 90 s for 30, 10 left
        assert progress.seconds_left() == 30.0
