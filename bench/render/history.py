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

from matplotlib.figure import Figure

from bench.judge.history import CaseHistory, History, change_text
from bench.measure.memory import MEMORY_RESOLUTION_MIB
from bench.render.document import Image, Links, Paragraph, Section, Table, render_html
from bench.render.formats import format_time
from bench.render.plots import Chart

CHART_DPI = 80
"""Lower than the report's: a page holds a chart per case (about 40 KB each at this resolution)."""
COLOURS = {"worse": "#c62828", "better": "#2e7d32"}
"""A step up in time (a regression) and a step down."""
METHOD_NOTE = (
    "A change point is where a case's time steps: binary segmentation, each split judged as `bench compare` "
    "judges two refs (the whole 95% interval of after / before past the factor, Bonferroni over the splits "
    "looked at); each run weighs by its rounds' spread plus the drift between runs (bench/results/"
    "changepoints.py). Memory: a step of more than 0.5 MiB and 1% between adjacent runs."
)


def page_name(history: History) -> str:
    """The scenario page's file name: `cpu-history--amd-epyc-7b13-2-cores-cpu.html`."""
    machine = re.sub(r"[^a-z0-9]+", "-", history.machine.lower()).strip("-")
    return f"{history.scenario}--{machine}.html"


def _chart(history: History, case: CaseHistory) -> Chart:
    """Time (estimate and interval, ms) and peak memory (MiB) against commit order, steps marked."""
    fig = Figure(figsize=(9.5, 4.6), layout="constrained", dpi=CHART_DPI)
    ax_t, ax_m = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    xs = list(range(len(history.runs)))
    xs_ok, times, down, up, memory = [], [], [], [], []
    for i, result in enumerate(case.results):
        if result is None or result.estimate is None:
            continue
        est = result.estimate
        xs_ok.append(i)
        times.append(est.median_s * 1e3)
        down.append((est.median_s - (est.low_s or est.median_s)) * 1e3)
        up.append(((est.high_s or est.median_s) - est.median_s) * 1e3)
        if result.memory is not None:
            memory.append((i, result.memory.peak_mib))
    ax_t.errorbar(xs_ok, times, yerr=[down, up], fmt="o-", capsize=3, color="#1565c0", lw=1)
    shared = [(x, t) for x, t in zip(xs_ok, times, strict=True) if case.contended(x)]
    if shared:  # a contended run's point is hollow and ringed: its time is not the code's alone
        ax_t.plot(
            *zip(*shared, strict=True), "o", ms=11, mfc="none", mec="#ef6c00", mew=1.5, label="contended"
        )
        ax_t.legend(loc="lower left", fontsize=7)
    ax_m.plot([i for i, _ in memory], [m for _, m in memory], "s-", color="#6a1b9a", lw=1, ms=4)
    for i, run in enumerate(history.runs):
        if run.run is None:  # the commit's bench could not run
            for ax in (ax_t, ax_m):
                ax.axvspan(i - 0.4, i + 0.4, color="#bbbbbb", alpha=0.4, lw=0)
    for change in case.changes:
        for ax in (ax_t, ax_m):
            ax.axvline(change.index - 0.5, color=COLOURS[change.verdict], ls="--", lw=1.2)
        ax_t.annotate(
            f"{change.ratio.ratio:.2f}x {change.effect}",
            (change.index - 0.5, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            color=COLOURS[change.verdict],
            fontsize=8,
        )
    ax_t.set_ylim(bottom=0)
    if memory:  # a flat line stays flat: the axis spans at least the meter's resolution either side
        peaks = [m for _, m in memory]
        middle = (max(peaks) + min(peaks)) / 2
        half = max((max(peaks) - min(peaks)) / 2 * 1.2, MEMORY_RESOLUTION_MIB)
        ax_m.set_ylim(middle - half, middle + half)
    ax_t.set_ylabel("time (ms)")
    ax_m.set_ylabel("peak MiB")
    ax_m.set_xticks(xs, [r.commit.short for r in history.runs], rotation=60, fontsize=7, ha="right")
    ax_m.set_xlabel("commit (oldest first; grey: its bench could not run)")
    for ax in (ax_t, ax_m):
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{case.key} · {history.machine}", fontsize=10)
    title = f"{case.key}: time and peak memory by commit"
    return Chart(name=case.key.replace("/", "--"), title=title, figure=fig, dpi=CHART_DPI)


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
    """The history's contention line, for the top of each page that shows it (none when no run was)."""
    shared = history.contention_summary()
    return [] if shared is None else [Paragraph(text=f"CONTENDED: {shared}")]


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
        blocks = [Image(chart=_chart(history, case)), _runs_table(history, case)]
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
