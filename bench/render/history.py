"""The history site (`bench history --out DIR`): static HTML pages, one per scenario and machine, an index.

- index.html: every scenario and machine, with its cases sorted by their latest change (newest first; cases
  without one after them), each change's commit, size and interval, and a link to the scenario's page;
- <scenario>--<machine>.html: per case a chart of its time (the estimate with its 95% interval) and its
  peak memory against commit order, the change points drawn where they start, and a table of the runs:
  commit, date, subject, time, memory, status. Pages are self-contained (charts embedded), as the report is.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

from bench.formats import format_time
from bench.judge.history import CaseHistory, History, break_notes, change_text
from bench.render.charts.history import history_chart
from bench.render.document import Image, Links, Paragraph, Section, Table, render_html

METHOD_NOTE = (
    "A change point is where a case's time steps: binary segmentation, each split judged as `bench compare` "
    "judges two refs (the whole 95% interval of after / before past the factor, Bonferroni over the splits "
    "looked at); each run weighs by its rounds' spread plus the drift between runs (bench/judge/"
    "changepoints.py). Memory: a step of more than 0.5 MiB and 1% between adjacent runs."
)


def page_name(history: History) -> str:
    """The scenario page's file name: `cpu-history--amd-epyc-7b13-2-cores-cpu.html`."""
    machine = re.sub(r"[^a-z0-9]+", "-", history.machine.lower()).strip("-")
    return f"{history.scenario}--{machine}.html"


def _runs_table(history: History, case: CaseHistory) -> Table:
    starts = {c.index: c for c in case.changes}
    rows = []
    for i, (run, result) in enumerate(zip(history.runs, case.results, strict=True)):
        step = starts.get(i)
        status = (
            "failed: " + (run.error or "").splitlines()[0][:80]
            if run.run is None
            else ("ok" if result else "-")
        )
        if result is not None and len(result.rounds) < result.case.rounds:  # the run stopped early
            status += f" ({len(result.rounds)} of {result.case.rounds} rounds: incomplete)"
        memory = f"{result.memory.peak_mib:.1f}" if result is not None and result.memory is not None else "-"
        rows.append(
            [
                str(i + 1),
                run.commit.short,
                run.date[:16].replace("T", " "),
                _subject(run.commit.subject, 70),
                format_time(result),
                memory,
                change_text(step, contended=case.change_contended(step)) if step is not None else "",
                status,
            ]
        )
    columns = ["#", "commit", "date", "subject", "time", "peak MiB", "change starts here", "status"]
    align = ["right", "left", "left", "left", "right", "right", "left", "left"]
    return Table(columns=columns, rows=rows, align=align)  # type: ignore[arg-type]


def _subject(subject: str | None, width: int) -> str:
    """A commit subject in `width` characters, cut at a word with an ellipsis, never mid-word."""
    return textwrap.shorten(subject or "", width, placeholder=" …")


def _latest(case: CaseHistory) -> tuple[int, str]:
    """Sort key: the newest change first, then cases without one."""
    index = case.latest_change()
    return (-(index if index is not None else -1), case.key)


def _changes_table(history: History) -> Table:
    """Every case's changes, newest first, and the cases without one after them."""
    rows = []
    for case in sorted(history.cases, key=_latest):
        if not case.changes:
            rows.append([case.key, "-", "-", "no change", ""])
            continue
        for change in sorted(case.changes, key=lambda c: -c.index):
            run = history.runs[change.index]
            rows.append(
                [
                    case.key,
                    run.commit.short,
                    run.date[:10],
                    change_text(change, contended=case.change_contended(change)),
                    _subject(run.commit.subject, 60),
                ]
            )
    columns = ["case", "commit", "date", "change", "subject"]
    return Table(columns=columns, rows=rows, align=["left"] * len(columns))


def _contention(history: History) -> list[Paragraph]:
    """The history's contention line and its breaks (runs not comparable, `bench history --force` looks
    across them), for the top of each page that shows it (none when no run was)."""
    shared = history.contention_summary()
    breaks = [Paragraph(text=line) for line in break_notes(history)]
    return breaks + ([] if shared is None else [Paragraph(text=f"CONTENDED: {shared}")])


def scenario_page(history: History) -> str:
    sections = [
        Section(
            title="Changes",
            blocks=[
                *_contention(history),
                _changes_table(history),
                Paragraph(text=METHOD_NOTE, small=True),
                Links(items=[("all scenarios", "index.html")]),
            ],
        )
    ]
    for case in sorted(history.cases, key=_latest):
        blocks = [Image(chart=history_chart(history, case)), _runs_table(history, case)]
        if case.memory_steps:
            steps = ", ".join(
                f"{history.runs[s.index].commit.short}: {s.before_mib:.1f} -> {s.after_mib:.1f} MiB"
                for s in case.memory_steps
            )
            blocks.append(Paragraph(text=f"peak memory steps: {steps}", small=True))
        sections.append(Section(title=case.key, blocks=blocks))
    title = f"History of {history.scenario} on {history.machine}: {len(history.runs)} runs"
    return render_html(title, sections)


def index_page(histories: Sequence[History]) -> str:
    sections = []
    for h in histories:
        first, last = h.runs[0].commit.short, h.newest.commit.short
        failed = [r.commit.short for r in h.runs if r.run is None]
        blocks = [
            Links(
                items=[(f"{h.scenario} on {h.machine}: {len(h.runs)} runs, {first} to {last}", page_name(h))]
            ),
            *_contention(h),
            _changes_table(h),
        ]
        if failed:
            blocks.append(
                Paragraph(text=f"commits whose bench could not run: {', '.join(failed)}", small=True)
            )
        sections.append(Section(title=f"{h.scenario} · {h.machine}", blocks=blocks))
    sections.append(Section(title="Method", blocks=[Paragraph(text=METHOD_NOTE)]))
    return render_html("gdn-cp-bench history: cases by their latest change", sections)


def write_site(histories: Sequence[History], out: Path) -> list[Path]:
    """index.html and a page per history into `out` (which the caller made); the paths written."""
    written = []
    for h in histories:
        path = out / page_name(h)
        path.write_text(scenario_page(h), encoding="utf-8")
        written.append(path)
    index = out / "index.html"
    index.write_text(index_page(histories), encoding="utf-8")
    return [index, *written]
