"""The report of one or more result files, as a list of sections (bench.render.document renders them).

Sections, in order (SECTIONS): an overview (one row per file: timing run or `bench verify` checks), base vs
head (two timing runs that share cases: the timing verdicts and both sides' accuracy checks, judged as
`bench gate` judges them), one section per scenario (its result tables, summary-checkpoint ablation,
scaling efficiency and charts, each chart drawn from the runs of that scenario only), the accuracy checks
of the verify files, cases not measured, and the environment (one row per distinct machine and software).
Each is built by a function `(runs: Sequence[ReportRun]) -> Section | list[Section] | None` (None: nothing
to say, the section is left out), so adding a section is one line: append its builder to SECTIONS (or pass
`sections=` to build_report).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from bench.errors import first_line
from bench.formats import (
    TIME_NOTE,
    contended_cases,
    contention_label,
    contention_summary,
    format_time,
    incomplete_summary,
    mostly_contended,
)
from bench.judge import analysis
from bench.judge.analysis import source_label
from bench.judge.comparison import CaseComparison, comparability, compare_runs, not_comparable_note
from bench.judge.gate import gate
from bench.judge.reference import not_measured, reference_tables, scenario_order
from bench.measure.statistics import format_ratio, ratio_interval
from bench.render.charts import Source, scenario_charts
from bench.render.document import Align, Folded, Image, Paragraph, Section, Table, document_blocks
from bench.render.efficiency import ablation_blocks, scaling_blocks
from bench.render.gate import accuracy_table, timing_table
from bench.render.report_run import ReportRun, SectionBuilder
from bench.render.tables import TableData, documents_table, reference_table_data
from bench.render.verification import verification_tables
from bench.results.store import RunResult


def _timing(runs: Sequence[ReportRun]) -> list[ReportRun]:
    return [r for r in runs if r.kind == "timing"]


def _verify(runs: Sequence[ReportRun]) -> list[ReportRun]:
    return [r for r in runs if r.kind == "verify"]


def _titled(tables: Sequence[TableData], r: ReportRun, several: bool) -> list[TableData]:
    """The tables, their titles prefixed with the run's label when several runs share a scenario."""
    if several:
        for t in tables:
            t.title = f"{r.label}: {t.title}"
    return list(tables)


# ----------------------------------------------------------------------------------------------------------
# Sections


def _contents(r: ReportRun) -> str:
    """What a file holds: its cases by status, or its checks by outcome."""
    if r.kind == "timing":
        counts = {s: sum(c.status == s for c in r.run.cases) for s in ("ok", "failed", "skipped")}
        text = f"{len(r.run.cases)} cases: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        shared, _ = contended_cases(r.run.cases)
        return text + (f" ({shared} of them CONTENDED)" if shared else "")
    if r.kind == "verify":
        records = r.run.verifications
        passed = sum(v.passed for v in records)
        rest = {s: sum(v.status == s for v in records) for s in ("failed", "skipped")}
        failed_checks = sum(v.status == "ok" and not v.passed for v in records)
        parts = [f"{passed} pass"] + ([f"{failed_checks} FAIL"] if failed_checks else [])
        parts += [f"{n} {'not run' if s == 'failed' else s}" for s, n in rest.items() if n]
        return f"{len(records)} checks: " + ", ".join(parts)
    return "nothing recorded"


def overview(runs: Sequence[ReportRun]) -> Section:
    rows = [
        [
            str(r.number),
            f"`{r.path.name}`",
            r.kind,
            ", ".join(r.run.scenarios) or r.run.name,
            r.label,
            r.run.created_at.replace("T", " ")[:16],
            _contents(r),
        ]
        for r in runs
    ]
    blocks: list = [
        Table(
            columns=["#", "file", "kind", "scenarios", "label (branch@commit)", "created (UTC)", "contents"],
            rows=rows,
            align=["right", "left", "left", "left", "left", "left", "left"],
        )
    ]
    for r in _timing(runs):  # a banner per file timed on a shared machine: never presented as clean
        shared = contention_summary(r.run)
        if shared is not None:
            label = contention_label(r.run).upper()
            blocks.insert(0, Paragraph(text=f"{label}, #{r.number} {r.label}: {shared}."))
        short = incomplete_summary(r.run)
        if short is not None:
            blocks.insert(0, Paragraph(text=f"INCOMPLETE, #{r.number} {r.label}: {short}."))
    if _timing(runs):
        blocks.append(
            Paragraph(
                text=f"{TIME_NOTE}. A round's time is the median over repeats of the rank-max elapsed time "
                "(each repeat counts its slowest rank). Peak allocated is the rank-max peak of one "
                "forward+backward pass (a peak tagged fwd or prefill: of that pass, where only it ran), "
                "parameters and input included.",
                small=True,
            )
        )
    return Section(title="Overview", blocks=blocks)


def _same_code(a: RunResult, b: RunResult) -> bool:
    """Whether two files were written by the same commit (uncommitted changes make a tree its own)."""
    ea, eb = a.environment, b.environment
    return ea.git_commit == eb.git_commit and not ea.git_dirty and not eb.git_dirty


def base_vs_head(runs: Sequence[ReportRun]) -> Section | None:
    """Two timing runs sharing cases: the first is base, the second head; the verify files of each side's
    commit are its accuracy checks. Judged as `bench gate` judges (bench.judge.gate)."""
    timing = _timing(runs)
    if len(timing) != 2:
        return None
    base, head = timing
    comparison = compare_runs(base.run, head.run)
    if not comparison.cases:
        return None
    checks = _verify(runs)
    base_records = [v for r in checks if _same_code(r.run, base.run) for v in r.run.verifications]
    head_records = [v for r in checks if _same_code(r.run, head.run) for v in r.run.verifications]
    result = gate(comparison, base_records, head_records)
    timing, folded = _fold_not_comparable(timing_table(result), comparison.cases)
    tables = ([timing] if timing.rows else []) + ([accuracy_table(result)] if result.accuracy else [])
    blocks: list = [Paragraph(text=f"base #{base.number} {base.label}, head #{head.number} {head.label}.")]
    blocks += folded + document_blocks(tables)
    if not result.accuracy:
        blocks.append(
            Paragraph(
                text="No verify file of either side's commit (clean tree) is in the report.", small=True
            )
        )
    blocks.append(Paragraph(text=f"As `bench gate` would judge it: {result.summary()}."))
    return Section(title="Base vs head", blocks=blocks)


COMPARE_COMMAND = "bench compare"
"""The command whose flag compares what the report calls not comparable (a report has no such flag)."""
FOLD_ROWS = 24
"""A table of more rows is folded under a line saying what it holds (bench.render.document.Folded)."""


def _fold_not_comparable(table: TableData, cases: Sequence[CaseComparison]) -> tuple[TableData, list]:
    """The gate's timing table without the rows of cases not comparable, and those rows folded, one group
    per reason under its one line (what differs, and the flag that compares them anyway). The table's first
    len(cases) rows are `cases`, in order (bench.render.gate.timing_table)."""
    groups: dict[str, list[list[str]]] = {}
    kept = []
    for i, row in enumerate(table.rows):
        case = cases[i] if i < len(cases) else None
        if case is not None and case.verdict == "not comparable" and case.not_comparable:
            groups.setdefault(case.not_comparable, []).append(row)
        else:
            kept.append(row)
    folded = [
        Folded(
            summary=not_comparable_note(reason, len(rows), command=COMPARE_COMMAND),
            blocks=[Table(columns=table.headers, rows=rows, align=_align(table))],
        )
        for reason, rows in groups.items()
    ]
    return dataclasses.replace(table, rows=kept), folded


def _align(table: TableData) -> list[Align]:
    return ["right" if i in table.numeric else "left" for i in range(len(table.headers))]


def _side_by_side(runs: Sequence[ReportRun], scenario: str) -> list:
    """Every ok case of `scenario` in any of several runs: one row per case, a time column per run and the
    ratio of each later run to the first (its 95% interval across rounds); `n/c` where the two are not
    comparable (another machine, device, torch or scenario definition: bench.judge.comparison), with one
    line per reason; a ratio column that would hold nothing but n/c is left out, its line says why. Folded
    when long (FOLD_ROWS)."""
    first = runs[0]
    cases = {
        c.key: c.case for r in runs for c in r.run.cases if c.case.scenario == scenario and c.status == "ok"
    }
    order = scenario_order([scenario])
    keys = sorted(cases, key=lambda k: order(cases[k]))  # scenario order, not the order they ran in
    columns = ["case", *(f"#{r.number} {r.label}" for r in runs)]
    columns += [f"#{r.number} / #{first.number}" for r in runs[1:]]
    rows = []
    reasons: list[dict[str, int]] = [{} for _ in runs[1:]]  # per ratio column: reason -> cases
    for key in keys:
        found = [r.run.get(key) for r in runs]
        ok = [c if c is not None and c.status == "ok" else None for c in found]
        cells = [key.split("/", 1)[1], *(format_time(c) for c in ok)]
        base = ok[0]
        for j, (r, other) in enumerate(zip(runs[1:], ok[1:], strict=True)):
            reason = None if base is None or other is None else comparability(first.run, base, r.run, other)
            if base is None or other is None:
                cells.append("-")
            elif reason is not None:
                reasons[j][reason] = reasons[j].get(reason, 0) + 1
                cells.append("n/c")
            else:
                cells.append(format_ratio(ratio_interval(base.estimate_medians, other.estimate_medians)))
        rows.append(cells)
    notes, dropped = [], []
    for j, (r, why) in enumerate(zip(runs[1:], reasons, strict=True)):
        column = len(runs) + 1 + j
        empty = all(row[column] in ("n/c", "-") for row in rows)
        label = f"#{r.number} / #{first.number}" + (" not shown" if empty and why else "")
        notes += [f"{label}: {not_comparable_note(k, n, command=COMPARE_COMMAND)}" for k, n in why.items()]
        if empty and why:
            dropped.append(column)
    kept = [i for i in range(len(columns)) if i not in dropped]
    table = Table(
        columns=[columns[i] for i in kept],
        rows=[[row[i] for i in kept] for row in rows],
        title=f"{scenario}: every case side by side"
        + (f", ratios to #{first.number}" if len(kept) > len(runs) + 1 else ""),
    )
    blocks: list = [Paragraph(text=n) for n in notes]
    if len(rows) > FOLD_ROWS:
        what = f"{scenario}: {len(rows)} cases, the times of {', '.join(f'#{r.number}' for r in runs)}"
        return [*blocks, Folded(summary=what, blocks=[table])]
    return [*blocks, table]


def _results_blocks(runs: Sequence[ReportRun], scenario: str) -> list:
    if len(runs) > 1:  # one table, a column per run (instead of one table per file, stacked)
        return [
            *_side_by_side(runs, scenario),
            Paragraph(text=f"{TIME_NOTE}; n/c: not comparable.", small=True),
        ]
    tables = []
    for r in runs:
        found = [reference_table_data(t, r.run) for t in reference_tables(r.run) if t.scenario == scenario]
        packed = documents_table(r.run)
        if packed is not None:
            packed.rows = [row for row in packed.rows if row[0] == scenario]  # its first column: scenario
            found += [packed] if packed.rows else []
        tables += _titled(found, r, len(runs) > 1)
    return document_blocks(tables)


def _chart_blocks(runs: Sequence[ReportRun], scenario: str, prefixed: bool) -> list:
    built, notes = scenario_charts(
        [Source(label=r.label, run=r.run) for r in runs], scenario, prefixed=prefixed
    )
    return [Image(chart=c) for c in built] + [Paragraph(text=n, small=True) for n in notes]


def scenarios(runs: Sequence[ReportRun]) -> list[Section]:
    """One section per scenario of the timing runs: its tables, ablation, scaling and charts, drawn from the
    runs that measured it (and only those)."""
    timing = _timing(runs)
    names = list(dict.fromkeys(n for r in timing for n in analysis.scenario_names(r.run)))
    out = []
    for name in names:
        present = [r for r in timing if name in analysis.scenario_names(r.run)]
        definition = present[0].run.scenarios.get(name, {})
        which = ", ".join(f"#{r.number} {r.label}" for r in present)
        intro = Paragraph(
            text=f"{definition.get('description', '')} ({analysis.describe_layer(definition)}); "
            f"warmup / repeat {', '.join(_warmup_repeat(r.run, name) for r in present)}; from {which}."
        )
        parts = [
            ("Results", _results_blocks(present, name)),
            ("Ablations", ablation_blocks(present, name)),
            ("Scaling efficiency", scaling_blocks(present, name)),
            ("Charts", _chart_blocks(present, name, prefixed=len(names) > 1)),
        ]
        subsections = [Section(title=title, blocks=blocks) for title, blocks in parts if blocks]
        out.append(Section(title=f"Scenario {name}", blocks=[intro], subsections=subsections))
    return out


def not_measured_cases(runs: Sequence[ReportRun]) -> Section | None:
    several = len(_timing(runs)) > 1
    rows = [
        ([f"#{r.number}"] if several else []) + [c.key, c.status, first_line(c.error)]
        for r in runs
        for c in not_measured(r.run)
    ]
    if not rows:
        return None
    columns = (["file"] if several else []) + ["case", "status", "reason"]
    return Section(
        title="Not measured", blocks=[Table(columns=columns, rows=rows, align=["left"] * len(columns))]
    )


ENVIRONMENT_FIELDS: list[tuple[str, Callable[[RunResult], str]]] = [
    (
        "device",
        lambda r: f"{r.environment.device_type} ({r.environment.device_name}, {r.environment.backend})",
    ),
    (
        "host",
        lambda r: f"{r.environment.hostname}: {r.environment.cpu_model}, {r.environment.cpu_count} cores",
    ),
    ("threads per rank", lambda r: _threads(r)),
    ("launcher", lambda r: r.environment.launcher),
    (
        "software",
        lambda r: (
            f"torch {r.environment.torch_version}"
            + (f", torch-npu {r.environment.torch_npu_version}" if r.environment.torch_npu_version else "")
            + f", python {r.environment.python_version}"
        ),
    ),
]
"""The environment table's columns after `files`: files with equal cells share a row."""


def _threads(run: RunResult) -> str:
    if not run.cases:
        return "-"
    how = "configured" if run.environment.threads_per_rank is not None else "cores // ranks"
    return f"{analysis.threads_by_cp(run)} ({how})"


def environment(runs: Sequence[ReportRun]) -> Section:
    """One row per distinct machine and software; the files that share it are listed by number."""
    rows: dict[tuple[str, ...], list[str]] = {}
    for r in runs:
        cells = tuple(get(r.run) for _, get in ENVIRONMENT_FIELDS)
        rows.setdefault(cells, []).append(f"#{r.number}")
    table_rows = [[", ".join(files), *cells] for cells, files in rows.items()]
    columns = ["files", *(name for name, _ in ENVIRONMENT_FIELDS)]
    return Section(
        title="Environment", blocks=[Table(columns=columns, rows=table_rows, align=["left"] * len(columns))]
    )


def _warmup_repeat(run: RunResult, scenario: str) -> str:
    pairs = sorted({(c.case.warmup, c.case.repeat) for c in run.cases if c.case.scenario == scenario})
    return ", ".join(f"{w} / {n}" for w, n in pairs) or "-"


def verification(runs: Sequence[ReportRun]) -> Section | None:
    """The accuracy checks of the verify files, as `bench verify` prints them, one subsection per file."""
    checks = [r for r in runs if r.run.verifications]
    if not checks:
        return None
    subsections = [
        Section(
            title=f"#{r.number} {r.label}: {', '.join(r.run.scenarios) or r.run.name}",
            blocks=document_blocks(verification_tables(r.run.verifications)),
        )
        for r in checks
    ]
    return Section(title="Accuracy (bench verify)", subsections=subsections)


SECTIONS: list[SectionBuilder] = [
    overview,
    base_vs_head,
    scenarios,
    verification,
    not_measured_cases,
    environment,
]
"""The report's sections, in order. Append a builder to add one."""


def _few(items: Sequence[str], most: int = 3) -> str:
    """ "a, b, c" or "a, b, c +2 more"."""
    shown = ", ".join(items[:most])
    return shown + (f" +{len(items) - most} more" if len(items) > most else "")


def report_title(runs: Sequence[ReportRun]) -> str:
    """One short line: the timing scenarios, the verified ones, the commits."""
    timed = list(dict.fromkeys(n for r in _timing(runs) for n in r.run.scenarios))
    verified = list(dict.fromkeys(n for r in _verify(runs) for n in r.run.scenarios))
    what = [_few(timed)] if timed else []
    what += [f"verify {_few(verified)}"] if verified else []
    commits = list(dict.fromkeys(source_label(r.run) for r in runs))
    shared = " - mostly CONTENDED" if any(mostly_contended(r.run.cases) for r in _timing(runs)) else ""
    return f"gdn-cp-bench: {'; '.join(what) or 'no results'} ({_few(commits, 2)}){shared}"


def build_report(
    runs: Sequence[ReportRun], sections: Sequence[SectionBuilder] = SECTIONS
) -> tuple[str, list[Section]]:
    """The title and the non-empty sections of the report of `runs`."""
    built: list[Section] = []
    for build in sections:
        section = build(runs)
        built += section if isinstance(section, list) else [section] if section is not None else []
    return report_title(runs), built
