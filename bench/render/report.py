"""The report of one or more result files, as a list of sections (bench.render.document renders them).

Sections, in order (SECTIONS): overview, reference-shaped result tables, summary-checkpoint ablation, scaling
efficiency, charts, cases not measured, environment. Each is built by a function
`(runs: Sequence[ReportRun]) -> Section | None` (None: nothing to say, the section is left out), so
adding a section, such as the accuracy checks of `bench verify`, is one line: append its builder to
SECTIONS (or pass `sections=` to build_report).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.errors import first_line
from bench.render.document import Image, Paragraph, Section, Table, document_blocks
from bench.render.plots import Source, build_charts, sources_for
from bench.results import analysis
from bench.results.analysis import PASS_LABELS, AblationRow, ScalingPoint
from bench.results.store import RunResult
from bench.results.tables import (
    documents_table,
    format_mib,
    format_ms,
    format_tokens,
    not_measured,
    reference_table_data,
    reference_tables,
)
from bench.verification.tables import verification_tables


@dataclass(frozen=True, slots=True)
class ReportRun:
    """One result file of the report."""

    label: str
    """branch@commit (as the charts' legends name it)."""
    path: Path
    run: RunResult


SectionBuilder = Callable[[Sequence[ReportRun]], Section | None]


def report_runs(runs: Sequence[RunResult], paths: Sequence[Path]) -> list[ReportRun]:
    sources = sources_for(runs, [p.stem for p in paths])
    return [ReportRun(label=s.label, path=p, run=s.run) for s, p in zip(sources, paths, strict=True)]


def _per_run(runs: Sequence[ReportRun], build: Callable[[ReportRun], list]) -> tuple[list, list[Section]]:
    """One run: its blocks directly; several: one subsection per run (titled with its label)."""
    if len(runs) == 1:
        return build(runs[0]), []
    subsections = []
    for r in runs:
        blocks = build(r)
        if blocks:
            subsections.append(Section(title=r.label, blocks=blocks))
    return [], subsections


def _pct(value: float) -> str:
    return f"{value:+.1f}%"


# ----------------------------------------------------------------------------------------------------------
# Sections


def overview(runs: Sequence[ReportRun]) -> Section:
    blocks: list = []
    for r in runs:
        e = r.run.environment
        counts = {s: sum(c.status == s for c in r.run.cases) for s in ("ok", "failed", "skipped")}
        status = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none run"
        blocks.append(
            Paragraph(
                text=f"`{r.path.name}`: {r.run.name} at {r.label}, {e.device_type} ({e.device_name}, "
                f"{e.backend}) on {e.hostname}, {r.run.created_at}; {len(r.run.cases)} cases ({status})."
            )
        )
        for name, definition in r.run.scenarios.items():
            layer = analysis.describe_layer(definition)
            blocks.append(Paragraph(text=f"{name}: {definition.get('description', '')} ({layer})"))
    blocks.append(
        Paragraph(
            text="Times are medians over repeats of the rank-max elapsed time (each repeat counts its "
            "slowest rank; * marks a noisy case, IQR/median > 10%). Peak allocated is the rank-max peak of "
            "one forward+backward pass ((fwd): of the forward pass where only forward ran), parameters and "
            "input included.",
            small=True,
        )
    )
    return Section(title="Overview", blocks=blocks)


def results(runs: Sequence[ReportRun]) -> Section | None:
    def build(r: ReportRun) -> list:
        packed = documents_table(r.run)
        tables = [reference_table_data(t, r.run) for t in reference_tables(r.run)]
        return document_blocks([*tables, *([packed] if packed is not None else [])])

    blocks, subsections = _per_run(runs, build)
    if not blocks and not subsections:
        return None
    return Section(title="Results", blocks=blocks, subsections=subsections)


def _ablation_table(rows: Sequence[AblationRow]) -> Table:
    table_rows = []
    for a in rows:
        where = [str(a.cp), format_tokens(a.seq_len)]
        saved = a.memory_saved_mib
        table_rows.append(
            [*where, a.mode, "graph kept", format_ms(a.off.timing), format_mib(a.off.memory), "", ""]
        )
        table_rows.append(
            [
                *where,
                a.mode,
                "checkpoint",
                format_ms(a.on.timing),
                format_mib(a.on.memory),
                _pct(a.time_cost_pct),
                "-" if saved is None else f"{-saved:+.1f} MiB",
            ]
        )
    passes = sorted({a.pass_ for a in rows}, key=analysis.PASSES.index)
    median = " / ".join(f"{PASS_LABELS[p]} median" for p in passes)
    return Table(
        title=rows[0].scenario,
        columns=["cp", "global seq", "mode", "implementation", median, "peak allocated", "time", "memory"],
        rows=table_rows,
        align=["right", "right", "left", "left", "right", "right", "right", "right"],
    )


def checkpoint_ablation(runs: Sequence[ReportRun]) -> Section | None:
    def build(r: ReportRun) -> list:
        rows = analysis.checkpoint_ablation(r.run)
        return [
            _ablation_table([a for a in rows if a.scenario == name])
            for name in dict.fromkeys(a.scenario for a in rows)
        ]

    blocks, subsections = _per_run(runs, build)
    if not blocks and not subsections:
        return None
    note = Paragraph(
        text="graph kept: the (S, M) summary's autograd graph is kept from forward to backward (checkpoint "
        "off); checkpoint: the summary runs under activation checkpointing and is recomputed in backward. "
        "time and memory: checkpoint relative to graph kept (time +x%: slower; memory -y MiB: less peak "
        "allocated).",
        small=True,
    )
    return Section(title="Summary checkpoint ablation", blocks=[*blocks, note], subsections=subsections)


def _scaling_table(
    title: str,
    first: str,
    rows: Sequence[tuple[int, str, list[ScalingPoint]]],
    degrees: Sequence[int],
    cell: Callable[[ScalingPoint], str],
) -> Table:
    table_rows = []
    for length, label, points in rows:
        by_cp = {p.cp: p for p in points}
        base = format_ms(points[0].base.timing)
        table_rows.append(
            [format_tokens(length), label, base]
            + [cell(by_cp[cp]) if cp in by_cp else "-" for cp in degrees if cp != 1]
        )
    return Table(
        title=title,
        columns=[first, "mode", "t(cp=1)"] + [f"CP{cp}" for cp in degrees if cp != 1],
        rows=table_rows,
        align=["right", "left"] + ["right"] * (len(degrees)),
    )


def scaling(runs: Sequence[ReportRun]) -> Section | None:
    def build(r: ReportRun) -> list:
        blocks: list = []
        for name in analysis.scenario_names(r.run):
            degrees = analysis.cps(r.run, name)
            variants = analysis.variants(r.run, name)
            for pass_ in analysis.passes(r.run, name):
                strong = [
                    (n, v.label, pts)
                    for n in analysis.strong_lengths(r.run, name)
                    for v in variants
                    if len(pts := analysis.strong_scaling(r.run, name, v, pass_, seq_len=n)) > 1
                ]
                if strong:
                    blocks.append(
                        _scaling_table(
                            f"{name}, {PASS_LABELS[pass_]}: strong scaling, speedup t(cp=1)/t(cp) "
                            "(efficiency = speedup / cp)",
                            "global seq",
                            strong,
                            degrees,
                            lambda p: f"{p.ratio:.2f}x ({100 * p.ratio / p.cp:.0f}%)",
                        )
                    )
                weak = [
                    (n, v.label, pts)
                    for n in analysis.weak_lengths(r.run, name)
                    for v in variants
                    if len(pts := analysis.weak_scaling(r.run, name, v, pass_, local_seq_len=n)) > 1
                ]
                if weak:
                    blocks.append(
                        _scaling_table(
                            f"{name}, {PASS_LABELS[pass_]}: weak scaling, efficiency t(cp=1)/t(cp) at a "
                            "fixed length per rank",
                            "per rank",
                            weak,
                            degrees,
                            lambda p: f"{100 * p.ratio:.0f}% ({format_ms(p.result.timing)})",
                        )
                    )
        return blocks

    blocks, subsections = _per_run(runs, build)
    if not blocks and not subsections:
        return None
    note = Paragraph(
        text="Ideal: strong scaling speedup = cp (efficiency 100%); weak scaling efficiency 100% (as many "
        "tokens per rank, as much time). p2p and all_gather with summary checkpoint on where it ran.",
        small=True,
    )
    return Section(title="Scaling efficiency", blocks=[*blocks, note], subsections=subsections)


def charts(runs: Sequence[ReportRun]) -> Section | None:
    sources = [Source(label=r.label, run=r.run) for r in runs]
    built, notes = build_charts(sources)
    if not built and not notes:
        return None
    blocks: list = [Image(chart=c) for c in built]
    blocks += [Paragraph(text=n, small=True) for n in notes]
    return Section(title="Charts", blocks=blocks)


def not_measured_cases(runs: Sequence[ReportRun]) -> Section | None:
    rows = [
        ([r.label] if len(runs) > 1 else []) + [c.key, c.status, first_line(c.error)]
        for r in runs
        for c in not_measured(r.run)
    ]
    if not rows:
        return None
    columns = (["run"] if len(runs) > 1 else []) + ["case", "status", "reason"]
    return Section(
        title="Not measured", blocks=[Table(columns=columns, rows=rows, align=["left"] * len(columns))]
    )


def environment(runs: Sequence[ReportRun]) -> Section:
    def threads(run: RunResult) -> str:
        configured = run.environment.threads_per_rank
        how = "configured" if configured is not None else "cores // ranks"
        return f"{analysis.threads_by_cp(run)} ({how})"

    fields: list[tuple[str, Callable[[ReportRun], str]]] = [
        ("result file", lambda r: f"`{r.path.name}`"),
        ("created", lambda r: r.run.created_at),
        (
            "commit",
            lambda r: r.run.environment.git_commit + (" (dirty)" if r.run.environment.git_dirty else ""),
        ),
        ("branch", lambda r: r.run.environment.git_branch),
        ("device", lambda r: f"{r.run.environment.device_type} ({r.run.environment.device_name})"),
        ("backend", lambda r: r.run.environment.backend),
        ("host", lambda r: r.run.environment.hostname),
        ("CPU", lambda r: f"{r.run.environment.cpu_model}, {r.run.environment.cpu_count} cores"),
        ("threads per rank", lambda r: threads(r.run)),
        ("launcher", lambda r: r.run.environment.launcher),
        ("torch", lambda r: r.run.environment.torch_version),
        ("torch-npu", lambda r: r.run.environment.torch_npu_version or "-"),
        ("python", lambda r: r.run.environment.python_version),
        ("warmup / repeat", lambda r: _warmup_repeat(r.run)),
    ]
    columns = ["", *(r.label for r in runs)]
    rows = [[name, *(get(r) for r in runs)] for name, get in fields]
    return Section(
        title="Environment", blocks=[Table(columns=columns, rows=rows, align=["left"] * len(columns))]
    )


def _warmup_repeat(run: RunResult) -> str:
    pairs = sorted({(c.case.warmup, c.case.repeat) for c in run.cases})
    return ", ".join(f"{w} / {n}" for w, n in pairs) or "-"


def verification(runs: Sequence[ReportRun]) -> Section | None:
    """The accuracy checks of `bench verify` stored in the runs, as `bench verify` prints them."""
    blocks, subsections = _per_run(runs, lambda r: document_blocks(verification_tables(r.run.verifications)))
    if not (blocks or subsections):
        return None
    return Section(title="Accuracy (bench verify)", blocks=blocks, subsections=subsections)


SECTIONS: list[SectionBuilder] = [
    overview,
    results,
    checkpoint_ablation,
    scaling,
    verification,
    charts,
    not_measured_cases,
    environment,
]
"""The report's sections, in order. Append a builder to add one (e.g. the accuracy checks)."""


def report_title(runs: Sequence[ReportRun]) -> str:
    names = " + ".join(dict.fromkeys(r.run.name for r in runs))
    return f"gdn-cp-bench: {names} ({', '.join(r.label for r in runs)})"


def build_report(
    runs: Sequence[ReportRun], sections: Sequence[SectionBuilder] = SECTIONS
) -> tuple[str, list[Section]]:
    """The title and the non-empty sections of the report of `runs`."""
    built = [build(runs) for build in sections]
    return report_title(runs), [s for s in built if s is not None]
